"""Reasoning on the Responses API: a worker's `reasoning_content` becomes a reasoning item whose summary Codex
shows (non-streamed, and streamed with the reasoning summary events), checked against OpenAI's schemas and
read by the openai SDK; `reasoning_tokens` counted; reasoning items sent back in `input` give the assistant
turn its thinking; `reasoning.effort` reaches the engine and is echoed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from openai.types.responses import Response, ResponseReasoningItem

from gateway.errors import GatewayError
from gateway.ops.store import ResponseStore
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.reasoning import ReasoningDefault
from gateway.protocol.responses_api import ResponsesRequest
from gateway.translate import parse_body
from gateway.translate.responses import to_chat
from tests.unit.test_translate_responses import completion, request, respond, translate
from tests.unit.test_translate_responses_stream import check as check_events
from tests.unit.test_translate_responses_stream import chunk, run, sdk_client, types, usage_chunk
from tests.unit.test_translate_responses_stream import request as stream_request


def thinking_completion(thinking: str, text: str, reasoning_tokens: int = 4) -> dict[str, Any]:
    body = completion(text, completion_tokens=9)
    body["choices"][0]["message"]["reasoning_content"] = thinking
    body["usage"]["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    return body


def test_thinking_is_a_reasoning_item_before_the_message() -> None:
    response = respond(thinking_completion("Greeted; greet back.", "Hello!"), request())
    reasoning, message = response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["id"].startswith("rs_")
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Greeted; greet back."}]
    assert message["content"][0]["text"] == "Hello!"
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 4}
    parsed = Response.model_validate(response)
    assert isinstance(parsed.output[0], ResponseReasoningItem)
    assert parsed.output_text == "Hello!"


def test_thinking_only_still_answers_with_an_empty_message() -> None:
    body = completion(None)
    body["choices"][0]["message"]["reasoning_content"] = "Hmm."
    assert [i["type"] for i in respond(body, request())["output"]] == ["reasoning", "message"]


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "Greeted; "}),
    chunk({"reasoning_content": "greet back."}),
    chunk({"content": "Hello!"}),
    chunk(finish="stop"),
    usage_chunk(),
]


def test_a_stream_sends_the_reasoning_summary_events_codex_renders() -> None:
    events, stream = run(STREAM)
    check_events(events)
    assert types(events)[2:10] == [
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
    ]
    assert {e["item_id"] for e in events[3:8]} == {events[2]["item"]["id"]}
    assert events[6]["text"] == "Greeted; greet back."
    final = stream.final_response()
    assert [i["type"] for i in final["output"]] == ["reasoning", "message"]
    assert final["output"][0] == events[8]["item"]


def test_the_openai_sdk_accumulates_the_reasoning_summary() -> None:
    events, _ = run(STREAM)
    client = sdk_client(events)
    with client.responses.stream(model="smol", input="hi") as s:
        deltas = [e.delta for e in s if e.type == "response.reasoning_summary_text.delta"]
        final = s.get_final_response()
    assert deltas == ["Greeted; ", "greet back."]
    reasoning = final.output[0]
    assert isinstance(reasoning, ResponseReasoningItem)
    assert reasoning.summary[0].text == "Greeted; greet back."
    assert final.output_text == "Hello!"


def test_a_stream_that_only_thinks_still_ends_with_a_message() -> None:
    events, stream = run([chunk({"reasoning_content": "Hmm."}), chunk(finish="length")])
    check_events(events)
    assert [i["type"] for i in stream.final_response()["output"]] == ["reasoning", "message"]
    assert stream.final_response()["status"] == "incomplete"


def test_reasoning_items_sent_back_give_the_assistant_turn_its_thinking() -> None:
    req = request(
        input=[
            {"role": "user", "content": "Weather?"},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Use the tool."}],
             "encrypted_content": None},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "reasoning", "id": "rs_2", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Say it."}]},
            {"role": "assistant", "content": "18C."},
            {"role": "user", "content": "Thanks"},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
    )  # fmt: skip
    messages = translate(req, [])["messages"]
    assert [(m["role"], m.get("reasoning_content")) for m in messages] == [
        ("user", None), ("assistant", "Use the tool."), ("tool", None), ("assistant", "Say it."), ("user", None),
    ]  # fmt: skip
    engine = to_chat(req, []).to_engine(EngineTarget(model="w")).wire()["messages"]
    assert engine[1]["reasoning_content"] == "Use the tool." and engine[3]["content"] == "18C."


async def test_a_stored_reasoning_item_reaches_the_next_turn(tmp_path: Any) -> None:
    store = ResponseStore(tmp_path)
    first = request(input="Hi")
    await store.put(respond(thinking_completion("Greeted.", "Hello!"), first, "resp_1"), first.input_items())
    history = await store.history("resp_1")
    messages = translate(request(previous_response_id="resp_1", input="Again"), history)["messages"]
    assert messages[1] == {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}],
                           "reasoning_content": "Greeted."}  # fmt: skip
    store.close()


def test_effort_reaches_the_engine_and_the_models_default_applies_without_one() -> None:
    low = ReasoningDefault(effort="low", budget_tokens=300)
    asked = to_chat(request(reasoning={"effort": "none"}), []).to_engine(EngineTarget(model="w", reasoning=low))
    assert asked.chat_template_kwargs == {"enable_thinking": False, "thinking": False}
    assert asked.thinking_budget_tokens == 0
    default = to_chat(request(), []).to_engine(EngineTarget(model="w", reasoning=low)).wire()
    assert default["chat_template_kwargs"]["reasoning_effort"] == "low" and default["thinking_budget_tokens"] == 300


def test_an_unknown_effort_is_a_400_naming_it() -> None:
    with pytest.raises(GatewayError) as caught:
        request(reasoning={"effort": "extreme"})
    assert (caught.value.status, caught.value.param) == (400, "reasoning.effort")


def test_the_stream_request_round_trips_its_summary_setting() -> None:
    req = stream_request(reasoning={"summary": "auto"})
    events, _ = run(STREAM, req)
    assert events[0]["response"]["reasoning"] == {"effort": None, "summary": "auto"}
    assert json.loads(json.dumps(events[-1]["response"]))["reasoning"]["summary"] == "auto"


def test_codexs_recorded_turn_gets_the_reasoning_item_it_renders_and_sends_back() -> None:
    """Codex's recorded request (reasoning summary "auto", encrypted content included) answered with thinking:
    the reasoning item comes first and, replayed in Codex's next `input` as Codex sends it, is accepted."""
    fixtures = Path(__file__).parent.parent / "fixtures" / "clients"
    body = json.loads((fixtures / "codex_first_turn.json").read_text())["exchanges"][0]["body"]
    assert body["reasoning"] == {"summary": "auto"} and "reasoning.encrypted_content" in body["include"]
    req = parse_body(json.dumps(body).encode(), ResponsesRequest)
    response = respond(thinking_completion("Look at the repo first.", "Done."), req)
    assert response["reasoning"] == {"effort": None, "summary": "auto"}
    item = response["output"][0]
    assert item["type"] == "reasoning" and item["summary"][0]["text"] == "Look at the repo first."
    follow_up = {**body, "input": [*body["input"], item, response["output"][1], {"role": "user", "content": "ok"}]}
    messages = translate(parse_body(json.dumps(follow_up).encode(), ResponsesRequest), [])["messages"]
    assert messages[-2]["role"] == "assistant" and messages[-2]["reasoning_content"] == "Look at the repo first."
