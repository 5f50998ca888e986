"""Thinking through the real worker: the embedded SmolLM2 re-templated as DeepSeek-R1-Distill (its generation
prompt opens `<think>`), as Qwen3 (`enable_thinking`, Hermes tool calls) and as gpt-oss (harmony channels).

SmolLM2 does not think on its own: the R1 template's pre-filled `<think>` puts its output inside the thinking,
and `thinking_budget_tokens` makes the worker close it with forced tokens, so the answer (or a tool call held
to the grammar) follows. `ignore_eos` keeps the tiny model writing after the closing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from backends.llamacpp.worker.text import ChatTemplate
from backends.llamacpp.worker.tools.messages import template_messages
from backends.request import EngineMessage
from tests.fixtures.gguf_templates import retemplated_gguf, template_text
from tests.integration.test_tool_families import TOOLS
from tests.worker_process import MODEL, running_worker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "What is 2 + 2?"}]
TAGS = ("<think>", "</think>")


def _worker(family: str, smollm2_path: Path, tmp: Path) -> Iterator[str]:
    model = retemplated_gguf(smollm2_path, tmp / f"smollm2-{family}.gguf", template_text(family))
    with running_worker(model, tmp / "worker.log", "--ctx", "2048", "--slots", "2", "--n-threads", "1") as (_, url):
        yield url


@pytest.fixture(scope="module")
def r1(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _worker("deepseek_r1_distill", smollm2_path, tmp_path_factory.mktemp("r1"))


@pytest.fixture(scope="module")
def qwen3(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _worker("qwen3", smollm2_path, tmp_path_factory.mktemp("qwen3"))


@pytest.fixture(scope="module")
def gpt_oss(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _worker("gpt_oss", smollm2_path, tmp_path_factory.mktemp("gpt-oss"))


def _chat(url: str, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "messages": QUESTION, "temperature": 0, "max_tokens": 24, **extra}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_models_names_the_reasoning_format(r1: str, qwen3: str) -> None:
    for url in (r1, qwen3):
        assert httpx.get(url + "/v1/models").json()["data"][0]["reasoning_format"] == "deepseek"
        assert httpx.get(url + "/health").json()["reasoning_format"] == "deepseek"


def test_an_unclosed_block_is_all_thinking(r1: str) -> None:
    body = _chat(r1, ignore_eos=True)
    message, usage = body["choices"][0]["message"], body["usage"]
    assert message["reasoning_content"] and not message["content"]
    assert 0 < usage["completion_tokens_details"]["reasoning_tokens"] <= usage["completion_tokens"] == 24


def test_the_budget_closes_the_thinking_and_the_answer_follows(r1: str) -> None:
    body = _chat(r1, thinking_budget_tokens=5, ignore_eos=True, max_tokens=96)
    message, usage = body["choices"][0]["message"], body["usage"]
    assert message["reasoning_content"] and message["content"]
    # the forced closing ends the thinking and stays out of both texts; the tags the model writes after it
    # are hidden (greedy SmolLM2 on an AVX2-only EPYC goes on with its thought and copies `</think>` into its
    # answer again and again: llama.cpp issue 28182's desync)
    assert not any(tag in message["reasoning_content"] for tag in TAGS)
    assert not any(tag in message["content"] for tag in TAGS), message["content"]
    # the 5 budgeted tokens, then the closing's tokens until `</think>` is complete
    assert 5 <= usage["completion_tokens_details"]["reasoning_tokens"] < 12


def test_a_budget_message_is_the_thinkings_last_words(r1: str, gpt_oss: str) -> None:
    """`thinking_budget_message` is forced in before the closing: the thinking ends with it, the answer has none
    of it, and its tokens count as thinking (the answer is the same model's answer after it)."""
    note = "Enough: I answer now."
    for url in (r1, gpt_oss):
        body = _chat(url, thinking_budget_tokens=3, thinking_budget_message=note, ignore_eos=True, max_tokens=40)
        message, usage = body["choices"][0]["message"], body["usage"]
        assert message["reasoning_content"].rstrip().endswith(note), (url, message)
        assert note not in (message["content"] or ""), (url, message)
        assert usage["completion_tokens_details"]["reasoning_tokens"] >= 3 + 5, usage  # the message's tokens too


def test_the_stream_carries_reasoning_deltas_before_the_answer(r1: str) -> None:
    client = openai.OpenAI(base_url=r1 + "/v1", api_key="unused")
    stream = client.chat.completions.create(
        model=MODEL, messages=QUESTION, temperature=0, max_tokens=96, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True},
        extra_body={"thinking_budget_tokens": 5, "ignore_eos": True},
    )  # fmt: skip
    kinds, usage = [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            extra = choice.delta.model_extra or {}
            if extra.get("reasoning_content"):
                kinds.append(("reasoning", extra["reasoning_content"]))
            if choice.delta.content:
                kinds.append(("content", choice.delta.content))
    order = [kind for kind, _ in kinds]
    assert order[0] == "reasoning" and "content" in order
    assert order.index("content") > max(i for i, kind in enumerate(order) if kind == "reasoning")
    assert not any(tag in text for _, text in kinds for tag in TAGS)
    assert usage is not None and usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.reasoning_tokens >= 5


def test_a_budget_of_zero_skips_the_thinking(r1: str, qwen3: str) -> None:
    for url in (r1, qwen3):  # R1: the closing appended; Qwen3: its enable_thinking switch
        body = _chat(url, thinking_budget_tokens=0)
        message = body["choices"][0]["message"]
        assert "reasoning_content" not in message and message["content"], (url, message)
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0


def test_chat_template_kwargs_reach_the_template(qwen3: str) -> None:
    off = _chat(qwen3, chat_template_kwargs={"enable_thinking": False})
    assert "reasoning_content" not in off["choices"][0]["message"]
    prompt_off = off["usage"]["prompt_tokens"]
    on = _chat(qwen3)
    assert on["usage"]["prompt_tokens"] < prompt_off  # `<think>\n\n</think>\n\n` pre-filled only when off


def test_a_stop_string_written_while_thinking_does_not_end_the_reply(r1: str) -> None:
    thinking = _chat(r1, ignore_eos=True)["choices"][0]["message"]["reasoning_content"]
    word = thinking.split()[1]  # a word the model writes inside the thinking (greedy: the same again)
    body = _chat(r1, ignore_eos=True, stop=[word])
    choice = body["choices"][0]
    assert choice["message"]["reasoning_content"] == thinking and choice["finish_reason"] == "length"


def test_a_tool_call_follows_the_thinking(qwen3: str) -> None:
    body = _chat(
        qwen3,
        messages=[{"role": "user", "content": "Forecast for Oslo, 3 days?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        thinking_budget_tokens=4,
        max_tokens=96,
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["message"]["reasoning_content"]
    call = choice["message"]["tool_calls"][0]["function"]
    assert call["name"] in ("get_forecast", "get_time") and isinstance(json.loads(call["arguments"]), dict)


def test_history_thinking_reaches_the_template_as_it_reads_it() -> None:
    template = ChatTemplate(template_text("qwen3"), bos_token="", eos_token="<|im_end|>")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    history = [
        EngineMessage(role="user", content="Hi"),
        EngineMessage(role="assistant", content="Hello!", reasoning_content="old thought"),
        EngineMessage(role="user", content="Time?"),
        EngineMessage.model_validate(
            {"role": "assistant", "content": "", "reasoning": "I need the clock", "tool_calls": [call]}
        ),
        EngineMessage(role="tool", content="12:00", tool_call_id="call_1"),
    ]
    prompt = template.render(template_messages(history))
    assert "<think>\nI need the clock\n</think>" in prompt  # kept: a tool-call step of the current query
    assert "old thought" not in prompt  # Qwen3 drops thinking of turns before the last user query


def test_harmony_analysis_is_reasoning_and_final_is_the_answer(gpt_oss: str) -> None:
    assert httpx.get(gpt_oss + "/v1/models").json()["data"][0]["reasoning_format"] == "harmony"
    body = _chat(gpt_oss, thinking_budget_tokens=5, ignore_eos=True, max_tokens=40)
    message = body["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"]
    assert "<|channel|>" not in message["content"] + message["reasoning_content"]
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 5
    skipped = _chat(gpt_oss, thinking_budget_tokens=0, chat_template_kwargs={"reasoning_effort": "low"})
    assert "reasoning_content" not in skipped["choices"][0]["message"]


def test_gpt_oss_keeps_the_thinking_of_a_tool_call_step() -> None:
    template = ChatTemplate(template_text("gpt_oss"), bos_token="", eos_token="")
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    history = [
        EngineMessage(role="user", content="Time?"),
        EngineMessage.model_validate(
            {"role": "assistant", "reasoning_content": "I need the clock", "tool_calls": [call]}
        ),
        EngineMessage(role="tool", content="12:00", tool_call_id="call_1"),
    ]
    prompt = template.render(template_messages(history), tools=[TOOLS[0]])
    assert "<|channel|>analysis<|message|>I need the clock<|end|>" in prompt


FORECAST = {"type": "function", "function": {"name": "get_forecast"}}


def _harmony_call_request(**extra: Any) -> dict[str, Any]:
    """A call the grammar forces on gpt-oss: the budget closes the analysis with `<|end|><|start|>assistant`,
    the grammar then writes a commentary message to `functions.get_forecast`."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Forecast for Oslo, 3 days?"}],
        "tools": TOOLS,
        "tool_choice": FORECAST,
        "temperature": 0,
        "max_tokens": 96,
        "extra_body": {"thinking_budget_tokens": 4},
        **extra,
    }


def test_harmony_a_forced_call_comes_back_as_tool_calls_unary_and_streamed(gpt_oss: str) -> None:
    client = openai.OpenAI(base_url=gpt_oss + "/v1", api_key="unused")
    reply = client.chat.completions.create(**_harmony_call_request())
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert (choice.message.model_extra or {}).get("reasoning_content")
    assert choice.message.tool_calls is not None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.id.startswith("call_") and call.function.name == "get_forecast"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    assert not choice.message.content or "<|" not in choice.message.content

    with client.chat.completions.stream(**_harmony_call_request()) as stream:
        final = stream.get_final_completion()
    streamed = final.choices[0]
    assert streamed.finish_reason == "tool_calls" and streamed.message.tool_calls is not None
    assert [(c.function.name, c.function.arguments) for c in streamed.message.tool_calls] == [
        (call.function.name, call.function.arguments)  # greedy: the same call, streamed
    ]

    # the call and its result go back through the template (gpt-oss renders them itself)
    history = [
        {"role": "user", "content": "Forecast for Oslo, 3 days?"},
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny"}'},
    ]
    answer = client.chat.completions.create(
        model=MODEL, messages=history, tools=TOOLS, temperature=0, max_tokens=8  # type: ignore[arg-type]
    )
    assert answer.usage is not None and reply.usage is not None
    assert answer.usage.prompt_tokens > reply.usage.prompt_tokens + 10  # the call and the result were rendered


def test_harmony_a_forced_call_with_no_thinking_skips_the_analysis(gpt_oss: str) -> None:
    """A budget of 0 cannot open the final channel (no call is made there): the grammar skips the analysis."""
    body = _chat(
        gpt_oss,
        messages=[{"role": "user", "content": "Forecast for Oslo, 3 days?"}],
        tools=TOOLS,
        tool_choice="required",
        thinking_budget_tokens=0,
        max_tokens=96,
    )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls", choice
    assert "reasoning_content" not in choice["message"]
