"""The rest of the chat API through `voltgate serve` on the real SmolLM2, with the official openai SDK:
logprobs (recomputed from the same GGUF in-process), logit_bias, n, many stop strings, default lengths,
frontend spellings and continuing a reply. Every body is checked against OpenAI's schemas."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from tests.e2e.conftest import DEFAULT_MAX_TOKENS, MODEL, Gateway
from tests.openai_schema import assert_matches_openai

pytestmark = pytest.mark.e2e
PROMPT = "The capital of France is"
BF16 = 30  # ggml_type


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> Iterator[llama_cpp.Llama]:
    """The same GGUF loaded in-process by llama-cpp-python, to recompute what the worker reports: flash
    attention and a bf16 KV cache, as the worker runs on a CPU (backends/llamacpp/worker/cli.py, --cache-type)."""
    llm = llama_cpp.Llama(
        model_path=str(smollm2_path), n_ctx=512, logits_all=True, flash_attn=True, verbose=False,
        type_k=BF16, type_v=BF16,
    )  # fmt: skip
    yield llm
    llm.close()


def greedy_logprobs(llm: llama_cpp.Llama, prompt: str, steps: int) -> list[tuple[str, float, dict[str, float]]]:
    """Greedy decoding by hand: each step's token, its log-softmax value and the top 3 alternatives."""
    llm.reset()
    tokens = llm.tokenize(prompt.encode(), add_bos=True, special=True)
    out = []
    for _ in range(steps):
        llm.eval(tokens if not out else tokens[-1:])
        row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        logprobs = row - (row.max() + math.log(np.exp(row - row.max()).sum()))
        top = np.argsort(-logprobs, kind="stable")[:3]
        piece = lambda t: llm.detokenize([int(t)]).decode("utf-8", "replace")  # noqa: E731
        out.append((piece(top[0]), float(logprobs[top[0]]), {piece(t): float(logprobs[t]) for t in top}))
        tokens.append(int(top[0]))
    return out


def test_completion_logprobs_match_values_recomputed_from_the_gguf(gateway: Gateway, reference: Any) -> None:
    completion = gateway.client().completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=3
    )
    assert_matches_openai("CreateCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    lp = completion.choices[0].logprobs
    assert lp is not None and lp.tokens and lp.token_logprobs and lp.top_logprobs
    expected = greedy_logprobs(reference, PROMPT, len(lp.tokens))
    for i, (token, logprob, top) in enumerate(expected):
        assert lp.tokens[i] == token
        assert lp.token_logprobs[i] == pytest.approx(logprob, abs=2e-3)
        assert lp.top_logprobs[i].keys() == top.keys()
    assert "".join(lp.tokens) == completion.choices[0].text


def test_chat_logprobs_have_openais_shape_streamed_and_not(gateway: Gateway) -> None:
    client = gateway.client()
    kwargs: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8,
                              "temperature": 0, "logprobs": True, "top_logprobs": 2}  # fmt: skip
    completion = client.chat.completions.create(**kwargs)
    assert_matches_openai("CreateChatCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in content)
    assert all(e.logprob <= 0 and bytes(e.bytes or []).decode() == e.token for e in content)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    for chunk in chunks:
        assert_matches_openai("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [(e.token, round(e.logprob, 4)) for e in content]


def test_logit_bias_minus_100_keeps_a_token_out_and_plus_100_forces_one(gateway: Gateway, reference: Any) -> None:
    client = gateway.client()
    paris = reference.tokenize(b" Paris", add_bos=False)[0]
    banned = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=0, logit_bias={str(paris): -100}
    )
    assert " Paris" not in (banned.choices[0].logprobs.tokens or [])  # type: ignore[union-attr]
    london = reference.tokenize(b" London", add_bos=False)[0]
    forced = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0.9, seed=1, logit_bias={str(london): 100}
    )
    assert forced.choices[0].text == " London" * 4


def test_n_choices_are_reproducible_with_a_seed_and_streaming_reassembles_them(gateway: Gateway) -> None:
    client = gateway.client()
    kwargs: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Name a fruit."}],
                              "max_tokens": 12, "temperature": 0.8, "seed": 7}  # fmt: skip
    first = client.chat.completions.create(**kwargs, n=3)
    assert_matches_openai("CreateChatCompletionResponse", first.model_dump(mode="json", exclude_unset=True))
    assert [c.index for c in first.choices] == [0, 1, 2]
    again = client.chat.completions.create(**kwargs, n=3)
    assert [c.message.content for c in again.choices] == [c.message.content for c in first.choices]
    assert first.usage is not None and first.usage.completion_tokens >= 3  # every choice's tokens, the prompt once
    single = client.chat.completions.create(**kwargs)
    assert single.usage is not None and first.usage.prompt_tokens == single.usage.prompt_tokens
    unary = client.chat.completions.create(**kwargs, n=2)
    texts = ["", ""]
    reasons: list[str | None] = [None, None]
    for chunk in client.chat.completions.create(**kwargs, n=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert texts == [c.message.content for c in unary.choices]
    assert all(reasons)


def test_eight_stop_strings_work(gateway: Gateway) -> None:
    prompt = "The days of the week are Monday,"
    full = gateway.client().completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    text = full.choices[0].text
    word = text.split()[2]
    stops = [f"never-{i}" for i in range(7)] + [word]
    cut = gateway.client().completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=stops)
    assert cut.choices[0].text == text[: text.index(word)]
    assert cut.choices[0].finish_reason == "stop"


def test_the_matched_stop_string_rides_a_relayed_stream_and_stays_out_of_a_whole_body(gateway: Gateway) -> None:
    """The worker names the stop string it matched (`stop_reason`, vLLM's extension). A chat stream is relayed
    as the worker sent it, so its finishing chunk carries the field, which OpenAI's schema allows (a choice
    takes extra fields) and the SDK keeps; a non-streamed body is rendered with OpenAI's fields only."""
    client = gateway.client()
    days = [{"role": "user", "content": "List the days of the week."}]
    kwargs: dict[str, Any] = {"model": MODEL, "messages": days, "max_tokens": 24, "temperature": 0}
    word = (client.chat.completions.create(**kwargs).choices[0].message.content or "").split()[2]
    whole = client.chat.completions.with_raw_response.create(**kwargs, stop=[word]).http_response.json()
    assert_matches_openai("CreateChatCompletionResponse", whole)
    assert whole["choices"][0]["finish_reason"] == "stop" and "stop_reason" not in whole["choices"][0]
    chunks = list(client.chat.completions.create(**kwargs, stop=["never-here", word], stream=True))
    for chunk in chunks:
        assert_matches_openai("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
    finishing = chunks[-1].choices[0]
    assert (finishing.finish_reason, finishing.model_extra) == ("stop", {"stop_reason": word})


def test_a_request_without_max_tokens_stops_at_the_models_default(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Write a long story."}], extra_body={"ignore_eos": True}
    )
    assert completion.usage is not None and completion.usage.completion_tokens == DEFAULT_MAX_TOKENS
    assert completion.choices[0].finish_reason == "length"


def test_open_webuis_repeat_penalty_is_honoured_not_ignored(gateway: Gateway) -> None:
    client = gateway.client()
    kwargs: dict[str, Any] = {"model": MODEL, "prompt": "one one one one one", "max_tokens": 12, "temperature": 0}
    plain = client.completions.create(**kwargs).choices[0].text
    penalised = client.completions.create(**kwargs, extra_body={"repeat_penalty": 5.0}).choices[0].text
    assert penalised != plain


def test_a_final_assistant_message_is_continued_not_answered(gateway: Gateway) -> None:
    messages: list[Any] = [{"role": "user", "content": "Complete the sentence."},
                           {"role": "assistant", "content": PROMPT}]  # fmt: skip
    client = gateway.client()
    continued = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)
    text = continued.choices[0].message.content or ""
    assert text.startswith(" ") and "Paris" in text  # the same sentence goes on
    fresh = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, extra_body={"continue_final_message": False}
    )
    assert fresh.choices[0].message.content != text
