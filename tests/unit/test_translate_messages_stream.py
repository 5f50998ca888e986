"""Anthropic Messages streaming: chat chunks → stream events, checked against the anthropic SDK's types and
replayed through its stream helper (over an in-process transport: no sockets)."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from gateway.errors import GatewayError
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.responses import ChatCompletionChunk
from gateway.translate import MessagesStream, encode_event, parse_body
from gateway.translate.messages import to_chat

typed = ChatCompletionChunk.model_validate  # the chat chunks the streams are fed, typed as the session yields them

EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **choice: Any) -> dict[str, Any]:
    entry = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish, **choice}
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "smol", "choices": [entry]}


def usage_chunk(prompt: int = 21, completion: int = 6) -> dict[str, Any]:
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
    chunk({"content": "Both:"}),
    chunk(call_delta(0, call_id="call_1", name="get_weather", arguments='{"city":')),
    chunk(call_delta(0, arguments='"Paris"}')),
    chunk(call_delta(1, call_id="call_2", name="get_weather", arguments='{"city":')),
    chunk(call_delta(1, arguments='"Rome"}')),
    chunk(finish="tool_calls"),
    usage_chunk(),
]


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "smol", "max_tokens": 32, "messages": [{"role": "user", "content": "hi"}], "stream": True}
    return MessagesRequest.model_validate(body | fields)


def run(
    chunks: list[dict[str, Any]], req: MessagesRequest | None = None
) -> tuple[list[dict[str, Any]], MessagesStream]:
    stream = MessagesStream(req or request(), message_id="msg_s")
    events = stream.start()
    for c in chunks:
        events += stream.feed(typed(c))
    return events + stream.finish(), stream


def check(events: list[dict[str, Any]]) -> None:
    """Every event but ping parses as the SDK's RawMessageStreamEvent; block indices open and close in order."""
    open_index: int | None = None
    next_index = 0
    for event in events:
        if event["type"] != "ping":
            EVENTS.validate_python(event)
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == next_index
            open_index, next_index = event["index"], next_index + 1
        elif event["type"] == "content_block_delta":
            assert event["index"] == open_index
        elif event["type"] == "content_block_stop":
            assert event["index"] == open_index
            open_index = None
    assert open_index is None


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def sdk_client(events: list[dict[str, Any]], sent: list[bytes] | None = None) -> anthropic.Anthropic:
    """The anthropic SDK reading our SSE bytes from an in-process transport (stands for the real route)."""
    body = b"".join(encode_event(e) for e in events)

    def handler(request: httpx2.Request) -> httpx2.Response:
        if sent is not None:
            sent.append(request.read())
        return httpx2.Response(200, content=body, headers={"content-type": "text/event-stream"})

    http = httpx2.Client(transport=httpx2.MockTransport(handler))  # this SDK's own fork of httpx
    return anthropic.Anthropic(base_url="http://voltgate.test", api_key="k", http_client=http, max_retries=0)


def test_text_stream_is_the_documented_event_flow() -> None:
    events, stream = run(TEXT)
    check(events)
    assert types(events) == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0]["message"]
    assert (start["id"], start["model"], start["content"], start["stop_reason"]) == ("msg_s", "smol", [], None)
    assert [e["delta"] for e in events[3:5]] == [
        {"type": "text_delta", "text": "Hel"},
        {"type": "text_delta", "text": "lo"},
    ]
    assert events[6]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert events[6]["usage"] == {
        "output_tokens": 6,
        "input_tokens": 21,
        "cache_creation_input_tokens": 0,  # no cache_read_input_tokens: the usage says nothing of a cache
    }
    final = stream.final_message()
    anthropic.types.Message.model_validate(final)
    assert final["content"] == [{"type": "text", "text": "Hello"}] and final["usage"] == {
        "input_tokens": 21,
        "output_tokens": 6,
        "cache_creation_input_tokens": 0,  # no cache_read_input_tokens: the usage says nothing of a cache
    }


def test_tool_call_fragments_are_forwarded_verbatim_as_partial_json() -> None:
    events, stream = run(ONE_CALL, request(tools=[WEATHER]))
    check(events)
    assert types(events)[2:] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[2]["content_block"] == {"type": "tool_use", "id": "call_abc", "name": "get_weather", "input": {}}
    assert [e["delta"]["partial_json"] for e in events[3:6]] == FRAGMENTS
    assert events[7]["delta"]["stop_reason"] == "tool_use"
    assert stream.final_message()["content"] == [
        {"type": "tool_use", "id": "call_abc", "name": "get_weather", "input": {"city": "Paris"}}
    ]


def test_text_then_two_parallel_tool_calls_are_three_sequential_blocks() -> None:
    events, stream = run(TWO_CALLS, request(tools=[WEATHER]))
    check(events)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["text", "tool_use", "tool_use"]
    content = stream.final_message()["content"]
    assert [(b.get("id"), b.get("input")) for b in content[1:]] == [
        ("call_1", {"city": "Paris"}),
        ("call_2", {"city": "Rome"}),
    ]


def test_length_finish_is_max_tokens() -> None:
    events, _ = run([chunk({"content": "Once"}), chunk(finish="length"), usage_chunk()])
    assert events[-2]["delta"]["stop_reason"] == "max_tokens"


def test_a_named_stop_sequence_is_reported() -> None:
    events, _ = run([chunk({"content": "x"}), chunk(finish="stop", stop_reason="END")], request(stop_sequences=["END"]))
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert events[-2]["usage"] == {"output_tokens": 0}  # no usage chunk: input tokens are left out, not zeroed


def test_failure_is_one_error_event_in_anthropics_envelope() -> None:
    stream = MessagesStream(request(), message_id="m")
    events = stream.feed(typed(chunk({"content": "Hal"})))
    events += stream.fail(503, "no worker is ready")
    assert types(events) == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert events[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "no worker is ready"}}
    assert stream.finish() == [] and stream.feed(typed(chunk({"content": "x"}))) == []


def test_a_fragment_for_a_closed_tool_call_is_an_upstream_error() -> None:
    stream = MessagesStream(request(), message_id="m")
    stream.feed(typed(chunk(call_delta(0, call_id="a", name="f", arguments="{"))))
    stream.feed(typed(chunk(call_delta(1, call_id="b", name="f", arguments="{"))))
    with pytest.raises(GatewayError) as caught:
        stream.feed(typed(chunk(call_delta(0, arguments="}"))))
    assert caught.value.status == 502


def test_sdk_stream_helper_accumulates_the_final_message() -> None:
    events, _ = run(TWO_CALLS, request(tools=[WEATHER]))
    client = sdk_client(events)
    with client.messages.stream(model="smol", max_tokens=32, messages=[{"role": "user", "content": "hi"}]) as stream:
        json_snapshots = [e.snapshot for e in stream if e.type == "input_json"]
        final = stream.get_final_message()
    assert json_snapshots[-1] == {"city": "Rome"}
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    assert [(b.id, b.input) for b in final.content if b.type == "tool_use"] == [
        ("call_1", {"city": "Paris"}),
        ("call_2", {"city": "Rome"}),
    ]
    assert (final.usage.input_tokens, final.usage.output_tokens) == (21, 6)


def test_sdk_stream_helper_reads_text() -> None:
    events, _ = run(TEXT)
    with sdk_client(events).messages.stream(
        model="smol", max_tokens=32, messages=[{"role": "user", "content": "hi"}]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello" and final.stop_reason == "end_turn" and final.id == "msg_s"


def test_sdk_raises_on_the_error_event() -> None:
    stream = MessagesStream(request(), message_id="m")
    events = stream.feed(typed(chunk({"content": "Hal"}))) + stream.fail(529, "overloaded")
    client = sdk_client(events)
    with pytest.raises(anthropic.APIStatusError) as caught:
        list(
            client.messages.create(
                model="smol", max_tokens=32, messages=[{"role": "user", "content": "hi"}], stream=True
            )
        )
    assert "overloaded" in str(caught.value)


def test_a_request_the_sdk_builds_parses_and_translates() -> None:
    sent: list[bytes] = []
    events, _ = run(TEXT)
    client = sdk_client(events, sent)
    with client.messages.stream(
        model="smol",
        max_tokens=32,
        system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]},
        ],
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        stop_sequences=["END"],
        metadata={"user_id": "u1"},
    ) as stream:
        stream.until_done()
    req = parse_body(sent[0], MessagesRequest, dotted=True)
    chat = to_chat(req)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "tool"]
    assert chat.parallel_tool_calls is False and chat.stop == ["END"] and chat.user == "u1"


def prompt_usage_chunk(prompt: int, cached: int) -> dict[str, Any]:
    """The worker's first chunk when asked `include_prompt_usage`: the role delta with the prompt's usage."""
    first = chunk({"role": "assistant", "content": ""})
    usage = {"prompt_tokens": prompt, "completion_tokens": 0, "total_tokens": prompt}
    return first | {"usage": usage | {"prompt_tokens_details": {"cached_tokens": cached}}}


def test_message_start_waits_for_the_first_chunk_and_reports_its_prompt_usage() -> None:
    stream = MessagesStream(request(), message_id="msg_s")
    assert stream.start() == [] and stream.keepalive() == [{"type": "ping"}]  # waiting: pings, no message yet
    events = stream.feed(typed(prompt_usage_chunk(21, 16)))
    assert types(events) == ["message_start", "ping"]
    assert events[0]["message"]["usage"] == {
        "input_tokens": 5, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 16,
    }  # fmt: skip
    events += stream.feed(typed(chunk({"content": "Hi"}))) + stream.feed(typed(chunk(finish="stop")))
    events += stream.feed(typed(usage_chunk(21, 1) | {"usage": usage_chunk(21, 1)["usage"] | {
        "prompt_tokens_details": {"cached_tokens": 16}}})) + stream.finish()  # fmt: skip
    check(events)
    assert events[-2]["usage"] == {
        "output_tokens": 1, "input_tokens": 5, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 16,
    }  # fmt: skip
    with sdk_client([{"type": "ping"}, *events]).messages.stream(model="smol", max_tokens=8, messages=[]) as sdk:
        kinds = [event.type for event in sdk]  # a ping before message_start is skipped like any other
        final = sdk.get_final_message()
    assert kinds[0] == "message_start" and (final.usage.input_tokens, final.usage.cache_read_input_tokens) == (5, 16)


def test_a_first_chunk_without_usage_starts_the_message_with_zero_input_tokens() -> None:
    """LMDeploy and remote endpoints know no `include_prompt_usage`: message_start says 0, message_delta counts."""
    events, _ = run(TEXT)
    assert events[0]["message"]["usage"]["input_tokens"] == 0 and events[-2]["usage"]["input_tokens"] == 21


def test_a_failure_before_any_chunk_starts_the_message_then_sends_the_error_event() -> None:
    stream = MessagesStream(request(), message_id="m")
    events = stream.keepalive() + stream.fail(429, "queued too long")
    assert types(events) == ["ping", "message_start", "ping", "error"]
    assert events[-1] == {"type": "error", "error": {"type": "rate_limit_error", "message": "queued too long"}}
    assert stream.keepalive() == [] and stream.finish() == []
