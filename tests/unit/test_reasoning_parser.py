"""The worker's reasoning parser on hand-fed text pieces: tags split across tokens, unclosed blocks, harmony
channels, detection from real templates, grammars held back until the thinking ends (native-free: `ChatOutput`,
which imports the tool grammars' llama.cpp code, is tested in tests/integration/test_reasoning_output.py)."""

from __future__ import annotations

import pytest

from backends.llamacpp.worker.reasoning import (
    NO_REASONING,
    ReasoningStream,
    ReasoningSyntax,
    Start,
    ThinkingBudget,
    after_thinking,
    select_reasoning,
)
from tests.fixtures.gguf_templates import template_text

DEEPSEEK = ReasoningSyntax("deepseek")
HARMONY = ReasoningSyntax("harmony")


def run(syntax: ReasoningSyntax, pieces: list[str], start: Start = "open") -> tuple[str, str]:
    """All reasoning and all answer text from feeding `pieces` one by one, then finishing."""
    stream = ReasoningStream(syntax, start)
    out = [p for piece in pieces for p in stream.push(piece)] + stream.finish()
    return "".join(t for k, t in out if k == "reasoning"), "".join(t for k, t in out if k == "content")


def chars(text: str) -> list[str]:
    return list(text)


@pytest.mark.parametrize("split", [str.split, chars, lambda t: [t]], ids=["words", "chars", "whole"])
def test_think_block_then_answer_whatever_the_split(split: object) -> None:
    text = "<think>\nLet me add 2 and 2.\n</think>\n\nThe answer is 4."
    pieces = split(text) if split is not str.split else [w + " " for w in text.split(" ")]  # type: ignore[operator]
    reasoning, content = run(DEEPSEEK, pieces)
    assert reasoning.strip() == "Let me add 2 and 2."
    assert content.strip() == "The answer is 4."
    assert "<think>" not in content + reasoning and "</think>" not in content + reasoning


def test_tags_split_across_tokens_are_held_not_shown() -> None:
    stream = ReasoningStream(DEEPSEEK)
    assert stream.push("<th") == []
    assert stream.push("ink>hmm </") == [("reasoning", "hmm ")]
    assert stream.thinking
    assert stream.push("thi") == []
    assert stream.push("nk>\n\nok") == [("content", "ok")]
    assert not stream.thinking


def test_text_that_only_looks_like_a_tag_start_is_released() -> None:
    stream = ReasoningStream(DEEPSEEK, "thinking")
    assert stream.push("a </th") == [("reasoning", "a ")]
    assert stream.push("ought> c") == [("reasoning", "</thought> c")]
    assert stream.push("x </b") == [("reasoning", "x </b")]


def test_an_unclosed_block_is_thinking_not_answer() -> None:
    reasoning, content = run(DEEPSEEK, ["<think>", "still thinking", " </thi"])
    assert reasoning == "still thinking </thi" and content == ""


def test_a_prompt_that_opened_the_thinking_starts_inside_it() -> None:
    reasoning, content = run(DEEPSEEK, ["first idea", "</think>", "\n\nanswer"], start="thinking")
    assert (reasoning, content) == ("first idea", "answer")


def test_an_answer_without_thinking_is_all_content() -> None:
    assert run(DEEPSEEK, ["  Hello", " there"]) == ("", "  Hello there")
    assert run(DEEPSEEK, ["x <think>y</think>"], start="answer") == ("", "x <think>y</think>")
    assert run(NO_REASONING, ["<think>y</think>z"]) == ("", "<think>y</think>z")


def test_harmony_analysis_is_thinking_and_final_is_the_answer() -> None:
    text = (
        "<|channel|>analysis<|message|>User wants a greeting.<|end|><|start|>assistant<|channel|>final<|message|>Hello!"
    )
    for pieces in ([text], chars(text)):
        assert run(HARMONY, pieces) == ("User wants a greeting.", "Hello!")


def test_harmony_unclosed_analysis_and_plain_text() -> None:
    assert run(HARMONY, ["<|channel|>analysis<|message|>thinking", " on"]) == ("thinking on", "")
    assert run(HARMONY, ["just text"]) == ("", "just text")
    assert run(HARMONY, ["skipped to the answer"], start="answer") == ("", "skipped to the answer")


@pytest.mark.parametrize(
    ("family", "expected", "switch"),
    [("qwen3", "deepseek", "enable_thinking"), ("deepseek_r1_distill", "deepseek", None), ("qwen2_5", "none", None)],
)
def test_detection_from_real_templates(family: str, expected: str, switch: str | None) -> None:
    syntax = select_reasoning(template_text(family))
    assert (syntax.format, syntax.switch) == (expected, switch)


def test_harmony_detection_and_where_output_starts() -> None:
    assert select_reasoning("{{ '<|start|>assistant<|channel|>final<|message|>' }}").format == "harmony"
    assert DEEPSEEK.start("<|Assistant|><think>\n") == "thinking"
    assert DEEPSEEK.start("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "answer"
    assert DEEPSEEK.start("<|im_start|>assistant\n") == "open"
    assert HARMONY.start("<|start|>assistant<|channel|>final<|message|>") == "answer"
    assert DEEPSEEK.skip("open") == "<think>\n\n</think>\n\n" and DEEPSEEK.skip("thinking") == "</think>\n\n"


def test_a_grammar_waits_for_the_end_of_the_thinking() -> None:
    grammar, triggers = after_thinking('root ::= "x"\n', (), DEEPSEEK, "thinking")
    assert grammar is not None and 'answer-root ::= "x"' in grammar and 'root ::= "</think>"' in grammar
    assert triggers == (r"[\s\S]*?(</think>)[\s\S]*",)
    lazy = after_thinking("g", (r"[\s\S]*?(<tool_call>)[\s\S]*",), DEEPSEEK, "thinking")
    assert lazy == ("g", (r"[\s\S]*?</think>[\s\S]*?(<tool_call>)[\s\S]*",))
    assert after_thinking("g", (), DEEPSEEK, "open") == ("g", ())


def test_the_budget_tracker_closes_an_open_block_after_limit_tokens() -> None:
    tracker = ThinkingBudget(3, (7, 8), DEEPSEEK, "open").tracker()
    assert [tracker.after(t) for t in ["<think>", "a", " b"]] == [(), (), ()]
    assert tracker.after(" c") == (7, 8)  # the third token generated inside the thinking
    assert tracker.after("</think>") == () and tracker.after("more") == ()


def test_the_budget_is_not_spent_on_a_block_the_model_closed() -> None:
    tracker = ThinkingBudget(2, (9,), DEEPSEEK, "thinking").tracker()
    assert [tracker.after(t) for t in ["x", "</think>", "answer", "text", "more"]] == [()] * 5
