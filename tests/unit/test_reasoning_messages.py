"""Reasoning on the Messages API: hand-fed worker answers and chunks with `reasoning_content` become thinking
blocks (checked against Anthropic's schema in tests/schemas/ and parsed by the anthropic SDK), history's
thinking and redacted_thinking blocks are accepted, and `thinking` / `output_config.effort` become the engine's
template switches and budget."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import anthropic.types
import pytest
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from gateway.errors import GatewayError
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.reasoning import ReasoningDefault
from gateway.protocol.responses import ChatCompletion
from gateway.translate import parse_body
from gateway.translate.messages import SIGNATURE, to_chat, to_message
from tests.unit.test_translate_messages_stream import EVENTS, check, chunk, run, sdk_client, types, usage_chunk

SCHEMAS = Path(__file__).parent.parent / "schemas" / "anthropic_messages.json"
FIXTURES = Path(__file__).parent.parent / "fixtures" / "clients"


@cache
def _validator(name: str) -> Draft202012Validator:
    registry: Registry = Registry().with_resource(
        "urn:anthropic", DRAFT202012.create_resource(json.loads(SCHEMAS.read_text()))
    )
    return Draft202012Validator({"$ref": f"urn:anthropic#/components/schemas/{name}"}, registry=registry)


def assert_anthropic(name: str, body: Any) -> None:
    """Raise jsonschema.ValidationError unless `body` is a valid Anthropic `name`."""
    _validator(name).validate(body)


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "smol", "max_tokens": 4096, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_body(json.dumps(body).encode(), MessagesRequest, dotted=True)


def engine(req: MessagesRequest, default: ReasoningDefault | None = None) -> dict[str, Any]:
    target = EngineTarget(model="w", reasoning=default or ReasoningDefault())
    return to_chat(req).to_engine(target).wire()


THINKING_ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "smol",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "Paris.", "reasoning_content": "The capital of France."},
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 9,
        "completion_tokens": 12,
        "total_tokens": 21,
        "completion_tokens_details": {"reasoning_tokens": 7},
    },
}


# -- answers ----------------------------------------------------------------------------------------------
def test_a_non_streamed_answer_leads_with_its_thinking_block() -> None:
    message = to_message(ChatCompletion.model_validate(THINKING_ANSWER), request(), message_id="msg_1")
    thinking, text = message["content"]
    assert thinking == {"type": "thinking", "thinking": "The capital of France.", "signature": SIGNATURE}
    assert text == {"type": "text", "text": "Paris."}
    assert_anthropic("ThinkingBlock", thinking)
    parsed = anthropic.types.Message.model_validate(message)
    assert isinstance(parsed.content[0], anthropic.types.ThinkingBlock)
    assert parsed.content[0].thinking == "The capital of France."


def test_vllms_reasoning_name_is_read_too() -> None:
    answer = json.loads(json.dumps(THINKING_ANSWER))
    message = answer["choices"][0]["message"]
    message["reasoning"] = message.pop("reasoning_content")
    out = to_message(ChatCompletion.model_validate(answer), request(), message_id="msg_1")
    assert out["content"][0]["thinking"] == "The capital of France."


THINKING_STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "Think"}),
    chunk({"reasoning_content": "ing."}),
    chunk({"content": "Hel"}),
    chunk({"content": "lo"}),
    chunk(finish="stop"),
    usage_chunk(),
]


def test_a_stream_opens_a_thinking_block_signs_and_closes_it_before_the_text() -> None:
    events, stream = run(THINKING_STREAM)
    check(events)
    assert types(events)[2:9] == [
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
    ]
    assert events[2]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert [e["delta"] for e in events[3:6]] == [
        {"type": "thinking_delta", "thinking": "Think"},
        {"type": "thinking_delta", "thinking": "ing."},
        {"type": "signature_delta", "signature": SIGNATURE},
    ]
    final = stream.final_message()
    assert final["content"][0] == {"type": "thinking", "thinking": "Thinking.", "signature": SIGNATURE}
    for event in events:
        if event["type"] != "ping":
            EVENTS.validate_python(event)


def test_the_anthropic_sdk_accumulates_the_thinking_block() -> None:
    events, _ = run(THINKING_STREAM)
    client = sdk_client(events)
    with client.messages.stream(model="smol", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as s:
        seen = [event.type for event in s]
        final = s.get_final_message()
    assert "thinking" in seen and "signature" in seen  # the SDK's own events for thinking_delta, signature_delta
    thinking, text = final.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock)
    assert (thinking.thinking, thinking.signature) == ("Thinking.", SIGNATURE)
    assert isinstance(text, anthropic.types.TextBlock) and text.text == "Hello"


def test_thinking_then_a_tool_call_streams_as_two_blocks() -> None:
    call = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": "{}"}}]}  # fmt: skip
    events, stream = run([chunk({"reasoning_content": "Use the tool."}), chunk(call), chunk(finish="tool_calls")])
    check(events)
    assert [b["type"] for b in stream.final_message()["content"]] == ["thinking", "tool_use"]


# -- history ----------------------------------------------------------------------------------------------
HISTORY = [
    {"role": "user", "content": "hi"},
    {
        "role": "assistant",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT"},
            {"type": "thinking", "thinking": "They greet me.", "signature": SIGNATURE},
            {"type": "text", "text": "Hello!"},
        ],
    },
    {"role": "user", "content": "again"},
]


def test_thinking_in_history_reaches_the_engine_and_redacted_thinking_is_left_out() -> None:
    for block in HISTORY[1]["content"][:2]:
        assert_anthropic("RedactedThinkingBlockParam" if block["type"] == "redacted_thinking" else
                         "ThinkingBlockParam", block)  # fmt: skip
    assistant = engine(request(messages=HISTORY))["messages"][1]
    assert assistant == {"role": "assistant", "content": "Hello!", "reasoning_content": "They greet me."}


def refusal(**fields: Any) -> GatewayError:
    with pytest.raises(GatewayError) as caught:
        request(**fields)
    assert caught.value.status == 400
    return caught.value


def test_thinking_blocks_in_a_user_turn_are_refused_by_name() -> None:
    exc = refusal(messages=[{"role": "user", "content": [{"type": "thinking", "thinking": "x", "signature": "s"}]}])
    assert (exc.param, exc.message) == ("messages.0.content.0.type", "thinking blocks belong to assistant messages")


# -- controls ---------------------------------------------------------------------------------------------
def test_thinking_disabled_switches_thinking_off_with_no_budget() -> None:
    thinking = {"type": "disabled"}
    assert_anthropic("ThinkingConfigDisabledParam", thinking)
    body = engine(request(thinking=thinking))
    assert body["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}
    assert body["thinking_budget_tokens"] == 0


def test_thinking_enabled_gives_its_budget_to_the_worker() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    assert_anthropic("ThinkingConfigEnabledParam", thinking)
    body = engine(request(thinking=thinking))
    assert body["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True}
    assert body["thinking_budget_tokens"] == 2048


def test_claude_codes_adaptive_thinking_and_effort_as_recorded() -> None:
    recorded = json.loads((FIXTURES / "claude_first_turn.json").read_text())["exchanges"][0]["body"]
    assert (recorded["thinking"], recorded["output_config"]) == ({"type": "adaptive"}, {"effort": "high"})
    req = request(thinking=recorded["thinking"], output_config=recorded["output_config"])
    body = engine(req, ReasoningDefault(effort="low", budget_tokens=100))
    assert body["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True, "reasoning_effort": "high"}
    assert "thinking_budget_tokens" not in body  # high: as long as the model wants, not the model's low budget
    own = engine(req, ReasoningDefault(effort="high", budget_tokens=100))  # high is the model's own effort
    assert own["thinking_budget_tokens"] == 100


def test_no_thinking_field_leaves_the_models_default() -> None:
    body = engine(request(), ReasoningDefault(effort="low"))
    assert body["chat_template_kwargs"]["reasoning_effort"] == "low"
    assert body["thinking_budget_tokens"] == 1024
    assert "chat_template_kwargs" not in engine(request())


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "param"),
    [
        ({"type": "enabled", "budget_tokens": 512}, 4096, "thinking.budget_tokens"),
        ({"type": "enabled"}, 4096, "thinking.budget_tokens"),
        ({"type": "enabled", "budget_tokens": 2048}, 2048, "max_tokens"),
        ({"type": "sometimes"}, 4096, "thinking.type"),
    ],
)
def test_a_thinking_config_anthropic_refuses_is_a_400_naming_it(
    thinking: dict[str, Any], max_tokens: int, param: str
) -> None:
    assert refusal(thinking=thinking, max_tokens=max_tokens).param == param
