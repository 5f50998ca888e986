"""The worker's reasoning parser on hand-fed text pieces: tags split across tokens, unclosed blocks, harmony
channels, detection from real templates, grammars held back until the thinking ends (native-free: `ChatOutput`,
which imports the tool grammars' llama.cpp code, is tested in tests/integration/test_reasoning_output.py)."""

from __future__ import annotations

import pytest

from backends.llamacpp.worker.reasoning import (
    NO_REASONING,
    BudgetTracker,
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


HARMONY_CALL = (
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"X"}<|call|>'
)


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("<|channel|>analysis<|message|>Need weather.<|end|>" + HARMONY_CALL, HARMONY_CALL),
        (  # the recipient in the role part, as the first message (the prompt wrote `<|start|>assistant`)
            ' to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>',
            '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"Paris"}<|call|>',
        ),
        (  # a preamble to the user (commentary to no one) is answer text; the call follows whole
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary<|message|>"
            "Checking.<|end|>" + HARMONY_CALL,
            "Checking." + HARMONY_CALL,
        ),
        (  # a call cut short: its text so far, for the tool parser to judge
            "<|channel|>analysis<|message|>Need weather.<|end|>" + HARMONY_CALL[:-12],
            HARMONY_CALL[:-12],
        ),
    ],
)
def test_harmony_call_messages_go_to_the_answer_whole(text: str, answer: str) -> None:
    for pieces in ([text], chars(text)):
        reasoning, content = run(HARMONY, pieces)
        assert content == answer, pieces
        assert reasoning == ("Need weather." if "analysis" in text else "")


def test_harmony_a_builtin_tool_on_the_analysis_channel_stays_thinking() -> None:
    text = "<|channel|>analysis to=browser.search <|constrain|>json<|message|>{}<|end|>"
    assert run(HARMONY, [text]) == ("{}", "")


def test_harmony_output_after_a_final_prompt_may_still_call() -> None:
    """The prompt opened the final channel (a budget of 0): its end and a later message are still read."""
    assert run(HARMONY, ["Sure.<|end|>" + HARMONY_CALL], start="answer") == ("", "Sure." + HARMONY_CALL)


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
    # ^...$: llama.cpp matches it against all the text; only whitespace may follow `</think>` in its token (more
    # would be replayed into the grammar, and llama.cpp aborts on text the grammar refuses)
    assert triggers == (r"^[\s\S]*?(</think>)[ \t\n]*$",)
    lazy = after_thinking("g", (r"^[\s\S]*?(<tool_call>)[\s\S]*$",), DEEPSEEK, "thinking")
    assert lazy == ("g", (r"^[\s\S]*?</think>[\s\S]*?(<tool_call>)[\s\S]*$",))
    assert after_thinking("g", (), DEEPSEEK, "open") == ("g", ())


def test_a_lazy_trigger_counts_only_outside_a_thinking_block_the_model_may_open() -> None:
    """Qwen3 with tool_choice auto: a `<tool_call>` written inside `<think>` must not start the grammar
    (the patterns' behaviour on llama.cpp's own regex: tests/integration/test_grammar_after_thinking.py)."""
    import re  # Python's re reads these patterns as std::regex's ECMAScript does

    _, triggers = after_thinking("g", (r"^[\s\S]*?(<tool_call>)[\s\S]*$",), DEEPSEEK, "open")

    def fires(text: str) -> bool:
        return any(re.fullmatch(t.removeprefix("^").removesuffix("$"), text) for t in triggers)

    assert not fires("<think>\nI could write <tool_call> here")
    assert fires("<think>\nhmm</think>\n\n<tool_call>\n{")
    assert fires("Sure. <tool_call>\n{")  # no thinking block: the answer began at once
    assert fires("Sure, no <think> here. <tool_call>")  # a tag mid-answer opens no thinking (ReasoningStream)


def test_a_harmony_whole_reply_grammar_admits_the_analysis_message_first() -> None:
    opened, _ = after_thinking('root ::= "x"\n', (), HARMONY, "open")
    assert opened is not None and 'answer-root ::= "x"' in opened
    assert 'root ::= ( "<|channel|>analysis<|message|>" h-not-end* "<|end|><|start|>assistant" )? answer-root' in opened
    inside, _ = after_thinking('root ::= "x"\n', (), HARMONY, "thinking")
    assert inside is not None and 'root ::= h-not-end* "<|end|><|start|>assistant" answer-root' in inside
    final, _ = after_thinking('root ::= "x"\n', (), HARMONY, "open", final_message=True)
    assert final is not None and 'h-final ::= "<|channel|>final"' in final and final.endswith(" h-final\n")
    assert after_thinking("g", ("^t$",), HARMONY, "open") == ("g", ("^t$",))  # lazy: anchored at a header
    assert after_thinking('root ::= "x"', (), HARMONY, "answer") == ('root ::= "x"', ())


def test_the_budget_tracker_closes_an_open_block_after_limit_tokens() -> None:
    tracker = ThinkingBudget(3, (7, 8), DEEPSEEK, "open").tracker()
    assert [tracker.after(t) for t in ["<think>", "a", " b"]] == [(), (), ()]
    assert tracker.after(" c") == (7, 8)  # the third token generated inside the thinking
    assert tracker.after("</think>") == () and tracker.after("more") == ()


def test_the_budget_is_not_spent_on_a_block_the_model_closed() -> None:
    tracker = ThinkingBudget(2, (9,), DEEPSEEK, "thinking").tracker()
    assert [tracker.after(t) for t in ["x", "</think>", "answer", "text", "more"]] == [()] * 5


def _cut(tracker: BudgetTracker, tokens: list[str]) -> tuple[str, int]:
    """What the tokens' texts show through `tracker` (each `after` first, as the engine calls them), and the
    characters hidden; the end of generation flushes what it held."""
    shown, hidden = [], 0
    for token in tokens:
        tracker.after(token)
        text, n = tracker.shown(token)
        shown.append(text)
        hidden += n
    text, n = tracker.shown("", final=True)
    return "".join(shown) + text, hidden + n


def test_after_a_forced_closing_the_models_own_tags_are_hidden() -> None:
    """llama.cpp issue 28182's desync: cut by its budget, the model goes on thinking and closes with its own
    `</think>` (split across tokens here), and may copy tags again; the answer shows its text but no tag."""
    tracker = ThinkingBudget(2, (7, 8), DEEPSEEK, "thinking").tracker()
    tokens = ["a", " b", "</think>", "\n\n", "still", " <think", ">ing", "</", "think>", " done", " </think> kept"]
    assert _cut(tracker, tokens) == ("a b</think>\n\nstill ing done  kept", len("<think></think></think>"))


def test_the_models_own_tags_are_shown_untouched_without_a_forced_closing() -> None:
    natural = ThinkingBudget(5, (7,), DEEPSEEK, "thinking").tracker()
    assert _cut(natural, ["x", "</think>", "a </think>", " <thi"]) == ("x</think>a </think> <thi", 0)
    harmony = ThinkingBudget(1, (7,), HARMONY, "thinking").tracker()
    assert _cut(harmony, ["x", "<|end|>", "y</think>"]) == ("x<|end|>y</think>", 0)


def test_a_possible_tag_held_after_a_forced_closing_goes_out_when_generation_ends() -> None:
    tracker = ThinkingBudget(1, (7,), DEEPSEEK, "thinking").tracker()
    assert _cut(tracker, ["x", "</think>", "answer </thi"]) == ("x</think>answer </thi", 0)


def test_harmony_a_header_counts_as_thinking_until_it_opens_no_analysis() -> None:
    """Reasoning tokens and the thinking budget count a header while it may still open the analysis."""
    for header, thinking in [
        ("<|channel|>analysis", True),
        (" to=functions.get", False),
        ("<|start|>assistant<|channel|>commentary", False),
        ("<|start|>assistant<|channel|>final", False),
    ]:
        stream = ReasoningStream(HARMONY)
        assert stream.thinking
        stream.push(header)
        assert stream.thinking is thinking, header
