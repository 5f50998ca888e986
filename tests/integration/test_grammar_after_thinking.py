"""Grammars that wait for the thinking, on llama.cpp's own sampler (its std::regex triggers, its grammar
engine) and the real SmolLM2 vocabulary: a lazy tool-call grammar does not start inside a Qwen3 `<think>`
block, harmony's call grammar starts only at a message header, and harmony's whole-reply grammars admit
the analysis message first.

The sampler is led through a text token by token; a token counts as allowed when the sampler, given logits
that favour it alone, picks it (a token the grammar forbids is never accepted: llama.cpp aborts on one).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from backends.llamacpp.worker.native import ContextOptions, Model
from backends.llamacpp.worker.reasoning import NO_REASONING, ReasoningSyntax, Start, after_thinking
from backends.llamacpp.worker.sampler import Sampler
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
    return Sampler(model, SamplingParams(temperature=0, grammar=grammar, grammar_triggers=triggers))


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
    chain = Sampler(model, SamplingParams(temperature=0, grammar=grammar, grammar_triggers=triggers))
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


# A child process: llama.cpp aborts the process on text its grammar refuses, which pytest would not survive.
_RUNS_ON = """
import sys
from pathlib import Path
from backends.llamacpp.worker.native import ContextOptions, Model
from backends.llamacpp.worker.tools.formats import HARMONY, HERMES
from tests.integration.test_grammar_after_thinking import GPT_OSS, NO_REASONING, QWEN3, follows, free, sampler
path, fmt, syntax, start, text = sys.argv[1:]
model = Model(Path(path), ContextOptions(n_ctx_per_seq=256, n_seq_max=1, n_threads=1, cache_type="bf16"))
chain = sampler(model, {"hermes": HERMES, "harmony": HARMONY}[fmt], {"qwen3": QWEN3, "gpt-oss": GPT_OSS,
    "none": NO_REASONING}[syntax], start, lazy=True)
print("followed" if follows(model, chain, text) else "refused", "free" if free(model, chain) else "held")
"""


@pytest.mark.parametrize(
    ("fmt", "syntax", "start", "text"),
    [
        ("hermes", "none", "answer", "Let me check. <tool_call></tool_call>"),  # `></` is one SmolLM2 token
        ("hermes", "qwen3", "open", "<think>\nOk.</think>\n\nLet me check. <tool_call></tool_call>"),
        ("hermes", "qwen3", "thinking", "Ok.</think>\n\n<tool_call></tool_call>"),
        ("harmony", "gpt-oss", "open", " to=functions.__"),  # `.__` is one token; no tool name starts `_`
    ],
)
def test_a_token_that_runs_past_a_call_opener_leaves_the_text_free(
    smollm2_path: Path, fmt: str, syntax: str, start: str, text: str
) -> None:
    """The worker aborted on `<tool_call` then `></` (llama.cpp's "Unexpected empty grammar stack" under
    real Claude Code): the trigger fired at `<tool_call>` and llama.cpp replayed the rest of the token,
    `</`, into the call grammar. Now the trigger does not fire there, and the text stays free."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", _RUNS_ON, str(smollm2_path), fmt, syntax, start, text],
        capture_output=True, text=True, timeout=120, cwd=root, env={"PYTHONPATH": str(root)}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["followed", "free"]


def test_a_call_opener_then_the_call_still_starts_the_grammar(model: Model) -> None:
    chain = sampler(model, HERMES, NO_REASONING, "answer", lazy=True)
    assert follows(model, chain, 'Let me check. <tool_call>\n{"name": "get_')
    assert not free(model, chain)
