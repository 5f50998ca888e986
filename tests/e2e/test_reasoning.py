"""Reasoning through `voltgate serve` and the real worker: the real SmolLM2 GGUF re-templated as a thinking
family (its generation prompt opens `<think>`, as DeepSeek-R1's and Qwen3's thinking prompts do, so the model's
output starts inside the thinking), a thinking budget closing the thinking, and the three APIs read with the
openai and anthropic SDKs.

The controls reaching the worker and the model's default in /v1/models are checked whatever the worker does.
The thinking itself needs the worker's reasoning parser (branch `reason-worker`): where the worker answers this
template with no `reasoning_content` (it reports no reasoning family for it), those tests skip, saying so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import Message, ThinkingBlock
from openai.types.responses import ResponseReasoningItem

from tests.conftest import free_port
from tests.e2e.conftest import Gateway, model_entry, running_gateway, write_config
from tests.fixtures.gguf_templates import retemplated_gguf, template_text

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MODEL = "smol-thinking"
VLLM_NAMED = "smol-thinking-reasoning"  # the same model, its chat answers naming the thinking `reasoning`
BUDGET = 6  # the model's default thinking budget (shown in /v1/models)
THINKING_TEMPLATE = (
    "{%- for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}"
    "{%- if add_generation_prompt %}assistant: "
    "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{%- else %}<think>\n{%- endif %}{%- endif %}"
)
"""Qwen3's and DeepSeek-R1's shape: thinking on, the prompt opens `<think>` (SmolLM2 then writes its thinking,
never closing it: all of it is thinking); `enable_thinking: false` writes an empty thinking first."""
BUDGET_MESSAGE = "Enough thinking: I answer now."
"""The vLLM-named model's `reasoning.budget_message`."""
ASK = [{"role": "user", "content": "What is 2+2?"}]
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def thinking(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("reasoning")
    gguf = retemplated_gguf(smollm2_path, tmp / "smollm2-thinking.gguf", THINKING_TEMPLATE)
    entry = model_entry(gguf, name=MODEL, default_max_tokens=24, reasoning={"effort": "low", "budget_tokens": BUDGET})
    renamed = model_entry(gguf, name=VLLM_NAMED, default_max_tokens=24, concurrency=1,
                          reasoning={"budget_tokens": BUDGET, "field": "reasoning",
                                     "budget_message": BUDGET_MESSAGE})  # fmt: skip
    with running_gateway(write_config(tmp, gguf, free_port(), models=[entry, renamed]), tmp / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="module")
def parsed(thinking: Gateway) -> Gateway:
    """The gateway, once the worker is seen to separate this template's thinking; else the test skips."""
    answer = thinking.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=16, extra_body=GREEDY)
    if not (answer.choices[0].message.model_extra or {}).get("reasoning_content"):
        pytest.skip("the worker reports no reasoning family for a <think> template (its parser is not merged)")
    return thinking


def test_the_models_reasoning_default_is_shown_in_models(thinking: Gateway) -> None:
    entry = httpx.get(f"{thinking.base_url}/models/{MODEL}", timeout=10).json()
    assert entry["reasoning"] == {"effort": "low", "budget_tokens": BUDGET, "budget_message": None,
                                  "field": "reasoning_content"}  # fmt: skip


@pytest.mark.parametrize(
    "controls",
    [
        {"reasoning_effort": "none"},
        {"reasoning_effort": "high", "thinking_budget_tokens": 3},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ],
)
def test_the_controls_are_taken_by_the_real_worker(thinking: Gateway, controls: dict[str, Any]) -> None:
    answer = thinking.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, extra_body={**GREEDY, **controls}
    )
    assert answer.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("stream", [False, True])
def test_a_model_named_for_vllm_answers_with_reasoning_streamed_or_not(thinking: Gateway, stream: bool) -> None:
    """The renaming runs on every answer of such a model (streamed: in the relayed bytes); the thinking is
    checked once the worker separates it."""
    body = {"model": VLLM_NAMED, "messages": ASK, "max_tokens": 16, "stream": stream, **GREEDY}
    response = httpx.post(f"{thinking.base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    text = response.text
    assert "reasoning_content" not in text
    if not stream:
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")
    else:
        assert text.rstrip().endswith("data: [DONE]")
    if '"reasoning"' not in text:
        pytest.skip("the worker reports no reasoning family for a <think> template (its parser is not merged)")


def test_chat_keeps_the_thinking_out_of_the_answer_and_counts_it(parsed: Gateway) -> None:
    answer = parsed.client().chat.completions.create(model=MODEL, messages=ASK, max_tokens=24, extra_body=GREEDY)
    message = answer.choices[0].message
    thinking = (message.model_extra or {})["reasoning_content"]
    assert thinking and "<think>" not in thinking and "<think>" not in (message.content or "")
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    reasoning = answer.usage.completion_tokens_details.reasoning_tokens or 0
    assert 0 < reasoning <= answer.usage.completion_tokens


def test_the_budget_closes_the_thinking_and_the_answer_follows(parsed: Gateway) -> None:
    answer = parsed.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=24, extra_body={**GREEDY, "thinking_budget_tokens": 4}
    )
    assert answer.usage is not None and answer.usage.completion_tokens_details is not None
    # the budget's 4 tokens, then the closing the worker forces (`</think>` and its blank line: a few tokens
    # of SmolLM2's vocabulary, counted as thinking); without the budget the thinking runs to max_tokens
    assert 4 <= (answer.usage.completion_tokens_details.reasoning_tokens or 0) <= 8
    assert answer.choices[0].message.content


def test_a_models_budget_message_ends_a_thinking_its_budget_cut(parsed: Gateway) -> None:
    """The config's `reasoning.budget_message` reaches the real worker with the model's budget: written where
    the budget cuts the thinking, it is the thinking's last words, and the answer follows without it."""
    body = {"model": VLLM_NAMED, "messages": ASK, "max_tokens": 48, **GREEDY}
    response = httpx.post(f"{parsed.base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    message = response.json()["choices"][0]["message"]
    assert message["reasoning"].rstrip().endswith(BUDGET_MESSAGE), message
    assert BUDGET_MESSAGE not in (message["content"] or ""), message
    shown = httpx.get(f"{parsed.base_url}/models/{VLLM_NAMED}", timeout=10).json()["reasoning"]
    assert shown["budget_message"] == BUDGET_MESSAGE


def test_a_chat_stream_sends_the_thinking_before_the_answer(parsed: Gateway) -> None:
    stream = parsed.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=24, stream=True, extra_body=GREEDY
    )
    kinds = []
    for chunk in stream:
        for choice in chunk.choices:
            if (choice.delta.model_extra or {}).get("reasoning_content"):
                kinds.append("thinking")
            if choice.delta.content:
                kinds.append("answer")
    assert kinds and kinds[0] == "thinking"
    if "answer" in kinds:
        assert "thinking" not in kinds[kinds.index("answer") :]


def test_effort_none_skips_the_thinking(parsed: Gateway) -> None:
    answer = parsed.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=12, reasoning_effort="none", extra_body=GREEDY
    )
    assert not (answer.choices[0].message.model_extra or {}).get("reasoning_content")


def test_responses_give_a_reasoning_item_and_echo_the_effort(parsed: Gateway) -> None:
    response = parsed.client().responses.create(model=MODEL, input="What is 2+2?", max_output_tokens=24, temperature=0)
    assert response.reasoning is not None and response.reasoning.effort == "low"  # the model's default
    item = response.output[0]
    assert isinstance(item, ResponseReasoningItem) and item.summary and item.summary[0].text
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0


def test_a_responses_stream_sends_the_reasoning_summary(parsed: Gateway) -> None:
    """The SDK's stream helper reads the summary events; the stream ends completed or, cut by
    max_output_tokens while still thinking, incomplete."""
    stream = parsed.client().responses.create(
        model=MODEL, input="What is 2+2?", max_output_tokens=24, temperature=0, stream=True
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.reasoning_summary_text.delta"]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    item = final.response.output[0]
    assert deltas and isinstance(item, ResponseReasoningItem) and item.summary[0].text == "".join(deltas)


def anthropic_client(gateway: Gateway) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)


def test_messages_give_a_thinking_block_and_disabled_gives_none(parsed: Gateway) -> None:
    client = anthropic_client(parsed)
    raw = client.messages.with_raw_response.create(model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY)
    Message.model_validate(raw.http_response.json())
    message = raw.parse()
    assert isinstance(message.content[0], ThinkingBlock) and message.content[0].thinking
    off = client.messages.create(
        model=MODEL, max_tokens=12, messages=ASK, thinking={"type": "disabled"}, extra_body=GREEDY
    )
    assert not any(isinstance(block, ThinkingBlock) for block in off.content)


def test_a_messages_stream_is_accumulated_by_the_sdk_with_its_signature(parsed: Gateway) -> None:
    with anthropic_client(parsed).messages.stream(
        model=MODEL, max_tokens=24, messages=ASK, extra_body=GREEDY
    ) as stream:
        final = stream.get_final_message()
    block = final.content[0]
    assert isinstance(block, ThinkingBlock) and block.thinking and block.signature


# --- gpt-oss (harmony): a tool call on the commentary channel, through the gateway -------------------------

HARMONY_MODEL = "smol-gpt-oss"
FORECAST_TOOL = {
    "type": "function",
    "function": {
        "name": "get_forecast",
        "description": "Weather forecast",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1}},
            "required": ["city", "days"],
        },
    },
}


@pytest.fixture(scope="module")
def gpt_oss(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """SmolLM2 under gpt-oss's own template, a thinking budget of 4 by default: the worker closes the analysis
    with a new assistant message and a forced call's grammar writes its header."""
    tmp = tmp_path_factory.mktemp("gpt-oss")
    gguf = retemplated_gguf(smollm2_path, tmp / "smollm2-gpt-oss.gguf", template_text("gpt_oss"))
    entry = model_entry(gguf, name=HARMONY_MODEL, default_max_tokens=96, reasoning={"budget_tokens": 4})
    with running_gateway(write_config(tmp, gguf, free_port(), models=[entry]), tmp / "gateway.log") as gw:
        yield gw


def test_a_harmony_tool_call_reaches_the_sdk_streamed_or_not(gpt_oss: Gateway) -> None:
    client = gpt_oss.client()
    ask = {
        "model": HARMONY_MODEL,
        "messages": [{"role": "user", "content": "Forecast for Oslo, 3 days?"}],
        "tools": [FORECAST_TOOL],
        "tool_choice": "required",
        "extra_body": GREEDY,
    }
    answer = client.chat.completions.create(**ask)  # type: ignore[call-overload]
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    assert (choice.message.model_extra or {}).get("reasoning_content")  # the analysis channel
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_forecast" and json.loads(call.function.arguments)["days"] >= 1
    with client.chat.completions.stream(**ask) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls" and streamed.message.tool_calls
    assert streamed.message.tool_calls[0].function.arguments == call.function.arguments
    follow_up = client.chat.completions.create(
        model=HARMONY_MODEL,
        messages=[
            {"role": "user", "content": "Forecast for Oslo, 3 days?"},
            choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sun"}'},
        ],
        tools=[FORECAST_TOOL],  # type: ignore[list-item]
        max_tokens=8,
        extra_body=GREEDY,
    )
    assert follow_up.choices[0].finish_reason in ("stop", "length", "tool_calls")
