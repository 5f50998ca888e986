"""Grammars that wait for the thinking, on llama.cpp's own sampler (its std::regex triggers, its grammar
engine) and the real SmolLM2 vocabulary: a lazy tool-call grammar does not start inside a Qwen3 `<think>`
block, harmony's call grammar starts only at a message header, and harmony's whole-reply grammars admit
the analysis message first.

The sampler is led through a text token by token; a token counts as allowed when the sampler, given logits
that favour it alone, picks it (a token the grammar forbids is never accepted: llama.cpp aborts on one).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.llamacpp.worker.native import ContextOptions, Model, Sampler
from backends.llamacpp.worker.reasoning import ReasoningSyntax, Start, after_thinking
from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.tools.formats import HARMONY, HERMES, ToolFormat
from tests.integration.test_tool_formats import CLOCK, WEATHER

pytestmark = pytest.mark.integration

QWEN3 = ReasoningSyntax("deepseek", "enable_thinking")
GPT_OSS = ReasoningSyntax("harmony")
CALL = '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[Model]:
    loaded = Model(smollm2_path, ContextOptions(n_ctx_per_seq=256, n_seq_max=1, n_threads=1, cache_type="bf16"))
    yield loaded
    loaded.close()


def sampler(model: Model, fmt: ToolFormat, syntax: ReasoningSyntax, start: Start, *, lazy: bool) -> Sampler:
    tools = [WEATHER, CLOCK]
    grammar, triggers = fmt.lazy_grammar(tools, False) if lazy else (fmt.grammar(tools, parallel=False), ())
    grammar, triggers = after_thinking(grammar, triggers, syntax, start)
    return model.new_sampler(SamplingParams(temperature=0, grammar=grammar, grammar_triggers=triggers))


def allowed(model: Model, chain: Sampler, token: int) -> bool:
    """Whether the sampler picks `token` when the logits favour it alone (then it is accepted)."""
    logits = np.zeros(model.n_vocab, dtype=np.float32)
    logits[token] = 100.0
    return chain.sample_row(logits) == token


def follows(model: Model, chain: Sampler, text: str) -> bool:
    """Whether the sampler lets `text` through token by token (stopping at the first it forbids)."""
    return all(allowed(model, chain, t) for t in model.tokenize(text, add_special=False, parse_special=False))


def free(model: Model, chain: Sampler) -> bool:
    """Whether free text may come next (no grammar holds the output); the sampler accepts what it picks."""
    return allowed(model, chain, model.tokenize(" hello", add_special=False)[0])


@pytest.mark.parametrize("start", ["open", "thinking"])
def test_a_call_tag_written_inside_the_thinking_does_not_start_the_grammar(model: Model, start: Start) -> None:
    chain = sampler(model, HERMES, QWEN3, start, lazy=True)
    opening = "<think>\n" if start == "open" else ""
    assert follows(model, chain, opening + "I could write <tool_call>")
    assert free(model, chain)  # still thinking: not held to the call grammar


def test_the_unwrapped_trigger_would_have_fired_inside_the_thinking(model: Model) -> None:
    tools = [WEATHER, CLOCK]
    grammar, triggers = HERMES.lazy_grammar(tools, False)
    chain = model.new_sampler(SamplingParams(temperature=0, grammar=grammar, grammar_triggers=triggers))
    assert follows(model, chain, "<think>\nI could write <tool_call>")
    assert not free(model, chain)  # the test above can fail: without the wrapping the grammar holds it


@pytest.mark.parametrize(
    ("start", "text"),
    [
        ("open", "<think>\nNeed the weather.</think>\n\n<tool_call>"),
        ("open", "Let me check. <tool_call>"),  # no thinking block: the answer began at once
        ("thinking", "Need the weather.</think>\n\n<tool_call>"),
    ],
)
def test_a_call_tag_after_the_thinking_starts_the_grammar(model: Model, start: Start, text: str) -> None:
    chain = sampler(model, HERMES, QWEN3, start, lazy=True)
    assert follows(model, chain, text)
    assert not free(model, chain)


@pytest.mark.parametrize(
    "text",
    [
        " to=functions.",  # the prompt ended in <|start|>assistant: a header at the very start
        "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary to=functions.",
        "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant to=functions.",
    ],
)
def test_harmony_lazy_grammar_starts_at_a_call_header(model: Model, text: str) -> None:
    chain = sampler(model, HARMONY, GPT_OSS, "open", lazy=True)
    assert follows(model, chain, text)
    assert not free(model, chain)


def test_harmony_lazy_grammar_ignores_a_header_written_inside_a_message(model: Model) -> None:
    chain = sampler(model, HARMONY, GPT_OSS, "open", lazy=True)
    assert follows(model, chain, "<|channel|>analysis<|message|>I may send <|channel|>commentary to=functions.")
    assert free(model, chain)


@pytest.mark.parametrize(
    ("start", "text"),
    [
        ("open", CALL.removeprefix("<|start|>assistant")),
        ("open", ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'),
        ("open", "<|channel|>analysis<|message|>Need it.<|end|>" + CALL),
        ("thinking", "Need it.<|end|>" + CALL),  # the prompt opened the analysis (a thinking budget)
    ],
)
def test_harmony_forced_call_grammar_admits_the_analysis_then_a_call(model: Model, start: Start, text: str) -> None:
    chain = sampler(model, HARMONY, GPT_OSS, start, lazy=False)
    assert follows(model, chain, text)
    assert not free(model, chain)


def test_harmony_forced_call_grammar_refuses_the_final_channel(model: Model) -> None:
    chain = sampler(model, HARMONY, GPT_OSS, "open", lazy=False)
    assert not follows(model, chain, "<|channel|>final<|message|>Hi")


def test_harmony_call_grammar_holds_the_arguments_to_the_schema(model: Model) -> None:
    good = CALL.removeprefix("<|start|>assistant")
    assert follows(model, sampler(model, HARMONY, GPT_OSS, "answer", lazy=False), good)
    assert not follows(model, sampler(model, HARMONY, GPT_OSS, "answer", lazy=False), good.replace('"Paris"', "3"))
