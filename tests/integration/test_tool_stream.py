"""The streaming tool-call parser: the same calls and text as the one-shot parse however the output is cut,
nothing shown that is later taken back, and an unfinished call given back as text."""

from __future__ import annotations

import json
import re
from collections.abc import Set
from typing import Any

import pytest

from backends.llamacpp.worker.tools import (
    CallArguments,
    CallStart,
    ParsedCall,
    StreamPiece,
    TextPiece,
    ToolCallStream,
    ToolFormat,
)
from backends.llamacpp.worker.tools.formats import HERMES, LLAMA3, MISTRAL_V11, HermesFormat
from backends.llamacpp.worker.tools.syntax import HermesSyntax, Scan
from tests.integration.test_tool_formats import NAMES, SAMPLES, expected

CALL_ID = re.compile(r"^call_[A-Za-z0-9]{24}$")


def run(fmt: ToolFormat, chunks: list[str]) -> list[StreamPiece]:
    stream = ToolCallStream(fmt, NAMES)
    pieces: list[StreamPiece] = []
    for chunk in chunks:
        pieces += stream.push(chunk)
    return pieces + stream.finish()


def collect(pieces: list[StreamPiece]) -> tuple[str, list[ParsedCall]]:
    """The streamed text joined, and the calls rebuilt from their start and argument pieces."""
    text = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    names: dict[int, str] = {}
    arguments: dict[int, str] = {}
    for piece in pieces:
        if isinstance(piece, CallStart):
            assert piece.index == len(names) and piece.index not in arguments  # in order, start first
            assert CALL_ID.match(piece.id)
            names[piece.index] = piece.name
        elif isinstance(piece, CallArguments):
            assert piece.index in names
            arguments[piece.index] = arguments.get(piece.index, "") + piece.fragment
    return text, [ParsedCall(names[i], arguments[i]) for i in sorted(names)]


def cuts(text: str) -> list[list[str]]:
    """The text whole, one character at a time, and cut in two at every boundary."""
    return [[text], list(text), *([text[:k], text[k:]] for k in range(1, len(text)))]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), SAMPLES)
def test_streaming_matches_the_one_shot_parse_at_every_cut(
    fmt: ToolFormat, text: str, content: Any, calls: Any
) -> None:
    want = expected(text, content, calls)
    for chunks in cuts(text):
        streamed_text, streamed_calls = collect(run(fmt, chunks))
        assert streamed_text == (want.content or ""), chunks
        assert streamed_calls == want.calls, chunks


def test_text_that_may_open_a_call_is_held_back_never_retracted() -> None:
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.push("Let me check. <tool") == [TextPiece("Let me check.")]
    assert stream.push('_call>\n{"name": "get_time"') == []
    pieces = stream.push("}\n</tool_call>")
    assert [type(p) for p in pieces] == [CallStart, CallArguments]
    assert pieces[1] == CallArguments(0, "{}")
    assert stream.finish() == []


def test_a_held_prefix_that_does_not_open_a_call_is_released() -> None:
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.push("a <tool") == [TextPiece("a")]
    assert stream.push("box> b") == [TextPiece(" <toolbox> b")]


def test_an_unfinished_call_comes_back_as_the_raw_text_at_finish() -> None:
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.push('<tool_call>\n{"name": "get_weather", "arguments": {"ci') == []
    assert stream.finish() == [TextPiece('<tool_call>\n{"name": "get_weather", "arguments": {"ci')]


@pytest.mark.parametrize(
    ("fmt", "text", "name", "arguments"),
    [
        (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris and a long', "get_weather",
         '{"city": "Paris and a long'),
        (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool', "get_weather",
         '{"city":"Oslo"}'),  # complete JSON, cut in the closing tag: a finished call
        (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": ', "get_weather", ""),
        (LLAMA3, '{"name": "get_time", "parameters": {"tz": "Europe/Os', "get_time", '{"tz": "Europe/Os'),
        (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": "Os', "get_weather", '{"city": "Os'),
    ],
)  # fmt: skip
def test_a_forced_call_cut_by_max_tokens_is_still_a_call(fmt: ToolFormat, text: str, name: str, arguments: str) -> None:
    """Output held to a call grammar is a call however short it was cut: its arguments so far, never text."""
    for chunks in ([text], list(text)):
        stream = ToolCallStream(fmt, NAMES, forced=True)
        pieces = [p for chunk in chunks for p in stream.push(chunk)] + stream.finish()
        assert collect(pieces) == ("", [ParsedCall(name, arguments)]), chunks


@pytest.mark.parametrize(
    ("fmt", "text", "calls"),
    [
        (HERMES, '<tool_call>\n{"name": "get_wea', [ParsedCall("get_weather", "")]),  # one tool starts so
        (MISTRAL_V11, "[TOOL_CALLS]get_we", [ParsedCall("get_weather", "")]),
        (HERMES, '<tool_call>\n{"name": "get_', []),  # get_weather or get_time: no call, and no syntax as text
        (HERMES, "<tool_call>\n{", []),
        (HERMES, "<tool_c", []),
    ],
)
def test_a_forced_call_cut_inside_its_name_is_its_tool_or_nothing(
    fmt: ToolFormat, text: str, calls: list[ParsedCall]
) -> None:
    stream = ToolCallStream(fmt, NAMES, forced=True)
    assert collect(stream.push(text) + stream.finish()) == ("", calls)


def test_an_unforced_unfinished_call_is_still_given_back_as_text() -> None:
    stream = ToolCallStream(HERMES, NAMES)
    assert stream.push('<tool_call>\n{"name": "get_wea') == []
    assert stream.finish() == [TextPiece('<tool_call>\n{"name": "get_wea')]


def test_a_malformed_call_turns_the_rest_into_text_but_sent_calls_stay() -> None:
    text = (
        '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call> and after'
    )
    pieces = run(HERMES, list(text))
    streamed_text, streamed_calls = collect(pieces)
    assert streamed_calls == [ParsedCall("get_time", "{}")]
    assert streamed_text == '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call> and after'
    assert HERMES.parse(text, NAMES).calls == []  # the one-shot parse gives the whole text instead


def test_llama3_holds_a_leading_object_until_it_is_known_to_be_a_call() -> None:
    stream = ToolCallStream(LLAMA3, NAMES)
    assert stream.push("\n{") == []
    assert stream.push('"answer": 1}') == [TextPiece('{"answer": 1}')]  # not a call: released as text


def test_mistral_calls_stream_one_by_one_with_fresh_ids() -> None:
    stream = ToolCallStream(MISTRAL_V11, NAMES)
    first = stream.push("[TOOL_CALLS]get_time[ARGS]{}[TOOL_CA")
    second = stream.push('LLS]get_weather[ARGS]{"city": "Oslo"}')
    assert [type(p) for p in first] == [CallStart, CallArguments]
    assert [type(p) for p in second] == [CallStart, CallArguments]
    assert isinstance(first[0], CallStart) and isinstance(second[0], CallStart)
    assert (first[0].index, second[0].index) == (0, 1) and first[0].id != second[0].id
    assert stream.calls == 2 and stream.finish() == []


class CountingHermesSyntax(HermesSyntax):
    """The real Hermes syntax, counting how often the stream rescans an open block."""

    def __init__(self) -> None:
        self.scans = 0

    def scan(self, text: str, names: Set[str], *, final: bool) -> Scan:
        self.scans += 1
        return super().scan(text, names, final=final)


def test_a_long_call_is_rescanned_only_where_it_may_close() -> None:
    code = 'def f(x):\n    return {"a": [x, {x}]}  # ) ] }\n' * 500
    text = "Writing it.\n" + '<tool_call>\n{"name": "write_file", "arguments": ' + json.dumps({"content": code})
    text += "}\n</tool_call>"
    syntax = CountingHermesSyntax()
    stream = ToolCallStream(HermesFormat(syntax), ["write_file"])
    pieces = [p for i in range(0, len(text), 3) for p in stream.push(text[i : i + 3])] + stream.finish()
    assert collect(pieces) == (
        "Writing it.",
        [ParsedCall("write_file", json.dumps({"content": code}, separators=(",", ":")))],
    )
    assert syntax.scans < 30  # not once per push: 25,000 characters arrive in over 8,000 pushes
