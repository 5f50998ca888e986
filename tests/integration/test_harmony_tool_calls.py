"""gpt-oss's harmony tool calls through `ChatOutput`, as the worker runs it: the reasoning parser splits the
channels, the harmony tool parser reads the call messages. Text cut at every boundary (tags and JSON split
across tokens), several calls, malformed and unknown calls (pure Python, but the tool formats import
llama.cpp's grammar code)."""

from __future__ import annotations

import json

import pytest

from backends.llamacpp.worker.output import ChatOutput, Delta, assemble, reasoning_text
from backends.llamacpp.worker.reasoning import ReasoningStream, ReasoningSyntax, Start
from backends.llamacpp.worker.tools import select_format
from backends.llamacpp.worker.tools.formats import HARMONY
from tests.fixtures.gguf_templates import template_text

GPT_OSS = ReasoningSyntax("harmony")
NAMES = ("get_weather", "get_time")
ANALYSIS = "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
IN_CHANNEL = (
    '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}'
)
IN_ROLE = "<|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}"
FINAL = "<|start|>assistant<|channel|>final<|message|>Looking it up."


def output_of(pieces: list[str], *, start: Start = "open", forced: bool = False) -> list[Delta]:
    output = ChatOutput(HARMONY, NAMES, forced=forced, reasoning=ReasoningStream(GPT_OSS, start))
    return [d for piece in pieces for d in output.push(piece)] + output.finish()


def cuts(text: str) -> list[list[str]]:
    """The text whole, one character at a time, and cut in two at every boundary."""
    return [[text], list(text), *([text[:k], text[k:]] for k in range(1, len(text)))]


def calls_of(deltas: list[Delta]) -> list[tuple[str, dict[str, object]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in assemble(deltas)[1]]


def test_the_gpt_oss_template_selects_the_harmony_format() -> None:
    assert select_format(template_text("gpt_oss")) is HARMONY


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (ANALYSIS + IN_CHANNEL + "<|call|>", None, [("get_weather", {"city": "Paris"})]),
        (ANALYSIS + IN_CHANNEL, None, [("get_weather", {"city": "Paris"})]),  # <|call|> ended generation
        (IN_ROLE.removeprefix("<|start|>assistant") + "<|call|>", None, [("get_time", {})]),  # the first message
        (
            ANALYSIS + FINAL + "<|end|>" + IN_CHANNEL + "<|call|>" + IN_ROLE + "<|call|>",
            "Looking it up.",
            [("get_weather", {"city": "Paris"}), ("get_time", {})],
        ),
        (  # a preamble on the commentary channel is content
            ANALYSIS + "<|start|>assistant<|channel|>commentary<|message|>One moment.<|end|>" + IN_ROLE,
            "One moment.",
            [("get_time", {})],
        ),
    ],
)
def test_calls_are_tool_calls_and_analysis_is_reasoning_at_every_cut(
    text: str, content: str | None, calls: list[tuple[str, dict[str, object]]]
) -> None:
    for pieces in cuts(text):
        deltas = output_of(pieces)
        assert calls_of(deltas) == calls, pieces
        assert assemble(deltas)[0] == content, pieces
        assert reasoning_text(deltas) == ("The user wants the weather." if ANALYSIS in text else None), pieces
        assert not any("<|" in (d.get("content") or "") for d in deltas), pieces


@pytest.mark.parametrize(
    "call",
    [
        '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": ',
        '<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>city=Paris<|call|>',
        "<|start|>assistant<|channel|>commentary to=functions.delete_all<|message|>{}<|call|>",  # not offered
        '<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>["Paris"]<|call|>',
    ],
)
def test_a_malformed_call_is_the_text_the_model_wrote(call: str) -> None:
    """As every format reports one: no call, the model's text as content."""
    for pieces in ([ANALYSIS + call], list(ANALYSIS + call)):
        deltas = output_of(pieces)
        assert assemble(deltas) == (call.strip(), []), pieces
        assert reasoning_text(deltas) == "The user wants the weather."


def test_a_forced_call_cut_by_max_tokens_is_still_a_call() -> None:
    text = ANALYSIS + '<|start|>assistant<|channel|>commentary to=functions.get_weather json<|message|>{"city": "Pa'
    deltas = output_of(list(text), forced=True)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in assemble(deltas)[1]] == [
        ("get_weather", '{"city": "Pa')
    ]


def test_a_call_after_the_budgets_closing_is_read() -> None:
    """With tools, a harmony thinking budget closes the analysis with `<|end|><|start|>assistant`: the model
    (or the call grammar) then writes the rest of the call's header."""
    text = "thinking so far<|end|><|start|>assistant" + IN_CHANNEL.removeprefix("<|start|>assistant")
    deltas = output_of(list(text), start="thinking")
    assert reasoning_text(deltas) == "thinking so far"
    assert calls_of(deltas) == [("get_weather", {"city": "Paris"})]
