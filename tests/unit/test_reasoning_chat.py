"""Reasoning on the chat API: the controls resolved against a model's default into the engine's template
variables and budget; thinking in history passed on under either name; a worker's `reasoning_content` and
`reasoning_tokens` relayed (checked against OpenAI's schema, read by the openai SDK) and renamed `reasoning`
where the model says so."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import openai.types.chat
import pytest

from gateway.config import Config
from gateway.errors import GatewayError
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.reasoning import Reasoning, ReasoningAsk, ReasoningDefault, resolve
from gateway.protocol.responses import ChatCompletion, ChatCompletionChunk
from gateway.serving.passthrough import renamed_reasoning
from tests.openai_schema import assert_matches_openai

OFF = Reasoning(effort="none", enabled=False, budget_tokens=0)


@pytest.mark.parametrize(
    ("ask", "default", "served"),
    [
        (ReasoningAsk(), ReasoningDefault(), Reasoning()),
        (ReasoningAsk(effort="none"), ReasoningDefault(effort="high"), OFF),
        (ReasoningAsk(disabled=True), ReasoningDefault(), OFF),
        (ReasoningAsk(budget_tokens=0), ReasoningDefault(), OFF),
        (ReasoningAsk(), ReasoningDefault(budget_tokens=0), OFF),
        (ReasoningAsk(effort="low"), ReasoningDefault(), Reasoning("low", True, 1024)),
        (ReasoningAsk(effort="minimal"), ReasoningDefault(), Reasoning("minimal", True, 256)),
        (ReasoningAsk(effort="high"), ReasoningDefault(budget_tokens=99), Reasoning("high", True, None)),
        (ReasoningAsk(effort="high"), ReasoningDefault(effort="high", budget_tokens=99), Reasoning("high", True, 99)),
        (ReasoningAsk(effort="low"), ReasoningDefault(effort="high", budget_tokens=99), Reasoning("low", True, 1024)),
        (ReasoningAsk(effort="low", budget_tokens=50), ReasoningDefault(), Reasoning("low", True, 50)),
        (ReasoningAsk(), ReasoningDefault(effort="medium", budget_tokens=99), Reasoning("medium", True, 99)),
        (ReasoningAsk(), ReasoningDefault(effort="medium"), Reasoning("medium", True, 4096)),
        (ReasoningAsk(budget_tokens=2048), ReasoningDefault(), Reasoning(None, True, 2048)),
        (ReasoningAsk(), ReasoningDefault(budget_tokens=300), Reasoning(None, True, 300)),
    ],
)
def test_an_ask_resolves_against_the_models_default(
    ask: ReasoningAsk, default: ReasoningDefault, served: Reasoning
) -> None:
    assert resolve(ask, default) == served


def test_engine_fields_carry_every_familys_switch_and_the_clients_variables_win() -> None:
    assert Reasoning().engine_fields() == {}
    assert OFF.engine_fields() == {
        "chat_template_kwargs": {"enable_thinking": False, "thinking": False},
        "thinking_budget_tokens": 0,
    }
    high = Reasoning("xhigh", True, None).engine_fields({"thinking": False, "custom": 1})
    assert high == {
        "chat_template_kwargs": {"enable_thinking": True, "thinking": False, "reasoning_effort": "high", "custom": 1}
    }


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request(json.dumps(body).encode(), ChatCompletionRequest)


def wire(req: ChatCompletionRequest, default: ReasoningDefault | None = None) -> dict[str, Any]:
    return req.to_engine(EngineTarget(model="w", reasoning=default or ReasoningDefault())).wire()


def test_reasoning_effort_reaches_the_engine() -> None:
    body = wire(chat(reasoning_effort="none"), ReasoningDefault(effort="high"))
    assert body["chat_template_kwargs"] == {"enable_thinking": False, "thinking": False}
    assert body["thinking_budget_tokens"] == 0
    body = wire(chat(reasoning_effort="medium", thinking_budget_tokens=77, chat_template_kwargs={"x": 1}))
    assert body["chat_template_kwargs"] == {"enable_thinking": True, "thinking": True, "reasoning_effort": "medium",
                                            "x": 1}  # fmt: skip
    assert body["thinking_budget_tokens"] == 77


def test_a_models_budget_message_goes_with_a_budget_it_can_cut() -> None:
    """`reasoning.budget_message` reaches the worker only where it may cut the thinking: a budget over 0."""
    default = ReasoningDefault(effort="low", budget_tokens=64, budget_message="Time to answer.")
    assert wire(chat(), default)["thinking_budget_message"] == "Time to answer."
    assert wire(chat(thinking_budget_tokens=9), default)["thinking_budget_message"] == "Time to answer."
    for unbounded in (chat(reasoning_effort="high"), chat(reasoning_effort="none"), chat(thinking_budget_tokens=0)):
        assert "thinking_budget_message" not in wire(unbounded, default)
    with pytest.raises(ValueError, match="budget_message"):
        ReasoningDefault(budget_message="x" * 1001)


def test_a_request_naming_nothing_sends_nothing_new_to_the_engine() -> None:
    body = wire(chat())
    assert "chat_template_kwargs" not in body and "thinking_budget_tokens" not in body


@pytest.mark.parametrize(
    ("fields", "param"),
    [({"reasoning_effort": "extreme"}, "reasoning_effort"), ({"thinking_budget_tokens": -1}, "thinking_budget_tokens")],
)
def test_a_bad_control_is_a_400_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        chat(**fields)
    assert (caught.value.status, caught.value.param) == (400, param)


def test_thinking_in_history_is_passed_on_under_either_name() -> None:
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b", "reasoning_content": "thought b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "d", "reasoning": "thought d"},
        {"role": "user", "content": "e"},
    ]
    sent = wire(chat(messages=messages))["messages"]
    assert [m.get("reasoning_content") for m in sent] == [None, "thought b", None, "thought d", None]


ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "4", "reasoning_content": "2+2"},
            "logprobs": None,
            "finish_reason": "stop",
        }
    ],
    "usage": {
        "prompt_tokens": 5,
        "completion_tokens": 6,
        "total_tokens": 11,
        "completion_tokens_details": {"reasoning_tokens": 3},
    },
}


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_an_answer_keeps_its_thinking_and_count_under_the_models_name(field: str) -> None:
    body = ChatCompletion.model_validate(ANSWER).wire(field)  # type: ignore[arg-type]
    assert_matches_openai("CreateChatCompletionResponse", body)
    message = body["choices"][0]["message"]
    assert message[field] == "2+2" and ({"reasoning_content", "reasoning"} - {field}).isdisjoint(message)
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    assert (parsed.choices[0].message.model_extra or {})[field] == "2+2"
    assert parsed.usage is not None and parsed.usage.completion_tokens_details is not None
    assert parsed.usage.completion_tokens_details.reasoning_tokens == 3


def test_an_answer_without_thinking_has_no_reasoning_field() -> None:
    answer = json.loads(json.dumps(ANSWER))
    del answer["choices"][0]["message"]["reasoning_content"]
    assert "reasoning_content" not in ChatCompletion.model_validate(answer).wire()["choices"][0]["message"]


def test_chunks_read_the_thinking_under_either_name() -> None:
    for name in ("reasoning_content", "reasoning"):
        chunk = ChatCompletionChunk.model_validate({"choices": [{"index": 0, "delta": {name: "hm"}}]})
        assert chunk.choices[0].delta.reasoning_content == "hm"


async def test_a_streams_reasoning_content_is_renamed_and_nothing_else() -> None:
    frames = [
        b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"say \\"reasoning_content\\": x"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"ok"}}]}\n\ndata: [DONE]\n\n',
    ]

    async def source() -> AsyncGenerator[bytes, None]:
        for frame in frames:
            yield frame

    out = [run async for run in renamed_reasoning(source())]
    first = json.loads(out[0][6:])
    assert first["choices"][0]["delta"] == {"reasoning": 'say "reasoning_content": x'}
    assert out[1] == frames[1]


def test_the_config_takes_a_models_reasoning_default_and_refuses_unknown_keys() -> None:
    model = {"name": "m", "sources": [{"gguf": "/m.gguf"}]}
    spec = Config.model_validate({"models": [{**model, "reasoning": {"effort": "low", "budget_tokens": 512}}]})
    assert spec.models[0].reasoning == ReasoningDefault(effort="low", budget_tokens=512)
    for bad in ({"effort": "lots"}, {"budget_tokens": -1}, {"field": "thoughts"}, {"budget": 1}):
        with pytest.raises(ValueError, match="reasoning"):
            Config.model_validate({"models": [{**model, "reasoning": bad}]})
