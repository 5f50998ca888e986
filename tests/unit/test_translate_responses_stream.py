"""Responses API streaming: chat chunks → the exact event sequence, checked against OpenAI's schemas and
replayed through the openai SDK (its stream accumulator, over an in-process transport: no sockets)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from gateway.errors import GatewayError
from gateway.protocol.chat_messages import AssistantMessage
from gateway.protocol.responses import ChatCompletionChunk
from gateway.protocol.responses_api import ResponsesRequest
from gateway.translate import ResponsesStream, encode_event, parse_body
from gateway.translate.responses import to_chat
from tests.responses_schema import assert_event_matches

typed = ChatCompletionChunk.model_validate  # the chat chunks the streams are fed, typed as the session yields them

WEATHER = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": None}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "smol", "choices": [choice]}


def usage_chunk(prompt: int = 9, completion: int = 4) -> dict[str, Any]:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "smol",
        "choices": [],
        "usage": usage,
    }


def call_delta(
    index: int, *, call_id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    delta: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        delta |= {"id": call_id, "type": "function"}
        delta["function"]["name"] = name
    return {"tool_calls": [delta]}


TEXT = [chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}), chunk({"content": "lo"}),
        chunk(finish="stop"), usage_chunk()]  # fmt: skip
FRAGMENTS = ['{"city"', ': "Par', 'is"}']
ONE_CALL = [
    chunk({"role": "assistant", "content": None}),
    chunk(call_delta(0, call_id="call_abc", name="get_weather")),
    *[chunk(call_delta(0, arguments=f)) for f in FRAGMENTS],
    chunk(finish="tool_calls"),
    usage_chunk(),
]
TWO_CALLS = [
    chunk({"role": "assistant"}),
    chunk(call_delta(0, call_id="call_1", name="get_weather", arguments='{"city":')),
    chunk(call_delta(0, arguments='"Paris"}')),
    chunk(call_delta(1, call_id="call_2", name="get_weather", arguments='{"city":')),
    chunk(call_delta(1, arguments='"Rome"}')),
    chunk(finish="tool_calls"),
    usage_chunk(),
]


def request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "smol", "input": "hi", "stream": True, **fields})


def run(
    chunks: list[dict[str, Any]], req: ResponsesRequest | None = None
) -> tuple[list[dict[str, Any]], ResponsesStream]:
    stream = ResponsesStream(req or request(), response_id="resp_s", created_at=1_700_000_000)
    events = stream.start()
    for c in chunks:
        events += stream.feed(typed(c))
    events += stream.finish(completed_at=1_700_000_001)
    return events, stream


def check(events: list[dict[str, Any]]) -> None:
    """Every event matches its schema, sequence numbers count up from 0, item/output indices agree."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        assert_event_matches(event)


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def sdk_client(events: list[dict[str, Any]], sent: list[bytes] | None = None) -> openai.OpenAI:
    """The openai SDK reading our SSE bytes from an in-process transport (stands for the real route)."""
    body = b"".join(encode_event(e) for e in events)

    def handler(request: httpx2.Request) -> httpx2.Response:
        if sent is not None:
            sent.append(request.read())
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    http = httpx2.Client(transport=httpx2.MockTransport(handler))  # the SDK's own fork of httpx
    return openai.OpenAI(base_url="http://voltgate.test/v1", api_key="k", http_client=http, max_retries=0)


def test_text_stream_is_the_exact_event_sequence() -> None:
    events, stream = run(TEXT)
    check(events)
    assert types(events) == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    added, done = events[2], events[8]
    assert added["item"]["content"] == [] and added["item"]["status"] == "in_progress"
    assert {e["item_id"] for e in events[3:8]} == {added["item"]["id"]}
    assert events[6]["text"] == "Hello" and done["item"]["status"] == "completed"
    final = events[-1]["response"]
    assert final == stream.final_response()
    assert final["status"] == "completed" and final["output"] == [done["item"]]
    assert final["usage"]["input_tokens"] == 9 and final["usage"]["output_tokens"] == 4
    assert final["completed_at"] == 1_700_000_001


def test_tool_call_arguments_concatenate_exactly_and_keep_the_call_id() -> None:
    events, stream = run(ONE_CALL, request(tools=[WEATHER]))
    check(events)
    assert types(events)[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]["item"]
    assert (added["type"], added["call_id"], added["name"], added["arguments"]) == (
        "function_call",
        "call_abc",
        "get_weather",
        "",
    )
    assert [e["delta"] for e in events[3:6]] == FRAGMENTS
    assert events[6]["arguments"] == '{"city": "Paris"}' and events[6]["name"] == "get_weather"
    [item] = stream.final_response()["output"]
    assert item["id"] == added["id"] and item["call_id"] == "call_abc" and item["arguments"] == '{"city": "Paris"}'


def test_parallel_tool_calls_are_two_items_each_closed_before_the_next() -> None:
    events, stream = run(TWO_CALLS, request(tools=[WEATHER]))
    check(events)
    item_events = [(e["type"].removeprefix("response."), e["output_index"]) for e in events if "output_index" in e]
    assert item_events == [
        ("output_item.added", 0),
        ("function_call_arguments.delta", 0),
        ("function_call_arguments.delta", 0),
        ("function_call_arguments.done", 0),
        ("output_item.done", 0),
        ("output_item.added", 1),
        ("function_call_arguments.delta", 1),
        ("function_call_arguments.delta", 1),
        ("function_call_arguments.done", 1),
        ("output_item.done", 1),
    ]
    output = stream.final_response()["output"]
    assert [(i["call_id"], i["arguments"]) for i in output] == [
        ("call_1", '{"city":"Paris"}'),
        ("call_2", '{"city":"Rome"}'),
    ]


def test_text_then_tool_call_closes_the_message_first() -> None:
    chunks = [chunk({"content": "Checking."}), *ONE_CALL[1:]]
    events, stream = run(chunks, request(tools=[WEATHER]))
    check(events)
    assert types(events)[2:9] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert [i["type"] for i in stream.final_response()["output"]] == ["message", "function_call"]


def test_length_finish_ends_incomplete() -> None:
    events, stream = run([chunk({"content": "Once upon"}), chunk(finish="length"), usage_chunk()])
    check(events)
    final = events[-1]
    assert final["type"] == "response.incomplete"
    assert final["response"]["status"] == "incomplete"
    assert final["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert stream.final_response()["output"][0]["status"] == "incomplete"


def test_failure_mid_stream_is_an_error_event_then_response_failed() -> None:
    stream = ResponsesStream(request(), response_id="resp_f", created_at=1)
    events = stream.feed(typed(chunk({"content": "Hal"})))
    events += stream.fail("the worker crashed", "worker_unavailable")
    check(events)
    assert types(events)[-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "server_error" and events[-2]["message"] == "the worker crashed"  # as in the Response
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"] == {"code": "server_error", "message": "the worker crashed"}
    assert failed["output"][0]["status"] == "incomplete" and failed["output"][0]["content"][0]["text"] == "Hal"
    assert stream.finish() == [] and stream.feed(typed(chunk({"content": "x"}))) == []


def test_a_fragment_for_a_closed_tool_call_is_an_upstream_error_not_mangled_arguments() -> None:
    stream = ResponsesStream(request(tools=[WEATHER]), response_id="r", created_at=1)
    stream.feed(typed(chunk(call_delta(0, call_id="a", name="get_weather", arguments="{"))))
    stream.feed(typed(chunk(call_delta(1, call_id="b", name="get_weather", arguments="{"))))
    with pytest.raises(GatewayError) as caught:
        stream.feed(typed(chunk(call_delta(0, arguments="}"))))
    assert caught.value.status == 502


def test_a_chunk_repeating_the_call_id_continues_the_same_call() -> None:
    chunks = [
        chunk(call_delta(0, call_id="a", name="f", arguments='{"x"')),
        chunk(call_delta(0, call_id="a", name="f", arguments=":1}")),
    ]
    _, stream = run(chunks)
    [item] = stream.final_response()["output"]
    assert item["arguments"] == '{"x":1}' and item["name"] == "f"


def test_an_empty_stream_still_ends_with_one_message() -> None:
    events, stream = run([chunk(finish="stop")])
    check(events)
    assert [i["type"] for i in stream.final_response()["output"]] == ["message"]


def test_sdk_stream_helper_accumulates_text_into_the_final_response() -> None:
    events, _ = run(TEXT)
    with sdk_client(events).responses.stream(model="smol", input="hi") as stream:
        seen = [event.type for event in stream]
        final = stream.get_final_response()
    assert seen == types(events)
    assert final.output_text == "Hello" and final.status == "completed"


def test_sdk_stream_helper_accumulates_tool_call_arguments_exactly() -> None:
    events, _ = run(TWO_CALLS, request(tools=[WEATHER]))
    with sdk_client(events).responses.stream(model="smol", input="hi") as stream:
        deltas = [e.snapshot for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert deltas[-1] == '{"city":"Rome"}'
    calls = [(item.call_id, item.arguments) for item in final.output if item.type == "function_call"]
    assert calls == [("call_1", '{"city":"Paris"}'), ("call_2", '{"city":"Rome"}')]
    assert [json.loads(item.arguments)["city"] for item in final.output if item.type == "function_call"] == [
        "Paris",
        "Rome",
    ]


def test_sdk_raw_stream_parses_every_event_type() -> None:
    events, _ = run(ONE_CALL, request(tools=[WEATHER]))
    parsed = list(sdk_client(events).responses.create(model="smol", input="hi", stream=True))
    assert [type(e).__name__ for e in parsed][:3] == [
        "ResponseCreatedEvent",
        "ResponseInProgressEvent",
        "ResponseOutputItemAddedEvent",
    ]
    last = parsed[-1]
    assert last.type == "response.completed"
    [item] = last.response.output
    assert item.type == "function_call" and item.call_id == "call_abc"


def test_a_request_the_sdk_builds_parses_and_translates() -> None:
    sent: list[bytes] = []
    events, _ = run(TEXT)
    stream = sdk_client(events, sent).responses.create(
        model="smol",
        instructions="Be brief.",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}, "strict": True}],
        tool_choice="auto",
        text={"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": True}},
        reasoning={"effort": "low"},
        max_output_tokens=32,
        metadata={"trace": "t1"},
        stream=True,
    )
    list(stream)
    req = parse_body(sent[0], ResponsesRequest)
    chat = to_chat(req, [])
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assistant = chat.messages[2]
    assert isinstance(assistant, AssistantMessage) and assistant.tool_calls and assistant.tool_calls[0].id == "call_1"
    assert chat.stream is True
