"""gpt-oss's harmony call syntax: a message addressed to `functions.NAME`, its body the arguments' JSON.

OpenAI's harmony format (and llama.cpp's gpt-oss parser) put the recipient either in the channel part of
the header or in the role part:

    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"X"}<|call|>
    <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city":"X"}<|call|>

on the commentary channel, or (llama.cpp accepts it too) the analysis channel. The reasoning parser
(`reasoning.ReasoningStream`) hands such a message to the answer whole, `<|start|>assistant` first (added
when the generation prompt wrote it) and its end marker last, so one opener, `<|start|>`, finds every call.
The message ends at `<|call|>` (an end-of-generation token for gpt-oss, so often absent), `<|end|>`, the
next message's `<|start|>`, or the end of the output.
"""

from __future__ import annotations

import re
from collections.abc import Set

from backends.llamacpp.worker.reasoning import HARMONY_HEADER_LIMIT, HARMONY_MESSAGE, HARMONY_START, recipient
from backends.llamacpp.worker.tools.calls import ParsedCall
from backends.llamacpp.worker.tools.syntax import FAIL, CallSyntax, Scan, json_at, make_call, skip_space, wait

START = HARMONY_START
MESSAGE = HARMONY_MESSAGE
CALL = "<|call|>"
END = "<|end|>"
_PARTIAL_NAME = re.compile(r"to=functions\.([A-Za-z0-9_.:-]*)")


class HarmonySyntax(CallSyntax):
    """`<|start|>assistant ... to=functions.NAME ... <|message|>{arguments}<|call|>`, one message per call."""

    triggers = (START,)

    def scan(self, text: str, names: Set[str], *, final: bool) -> Scan:
        at = text.find(MESSAGE)
        if at < 0:
            return FAIL if len(text) > HARMONY_HEADER_LIMIT else wait(final)
        name = recipient(text[len(START) : at])
        if name is None:
            return FAIL
        i = skip_space(text, at + len(MESSAGE))
        if i == len(text):
            return wait(final)
        if text[i] != "{":
            return FAIL
        found = json_at(text, i, final)
        if isinstance(found, Scan):
            return found
        arguments, end = found
        call = make_call(name, arguments, names)
        if call is None:
            return FAIL
        return _after_body(text, skip_space(text, end), call, final)

    def truncated_call(self, text: str, names: Set[str]) -> ParsedCall | None:
        """A forced call cut short: its tool once the header named one, its arguments so far."""
        at = text.find(MESSAGE)
        if at >= 0:
            name = recipient(text[len(START) : at])
            return ParsedCall(name, text[at + len(MESSAGE) :].strip()) if name is not None and name in names else None
        found = _PARTIAL_NAME.search(text)
        candidates = [name for name in names if found is not None and name.startswith(found.group(1))]
        return ParsedCall(candidates[0], "") if len(candidates) == 1 else None


def _after_body(text: str, j: int, call: ParsedCall, final: bool) -> Scan:
    """The end of a call message whose JSON body ends before `j`."""
    rest = text[j:]
    for marker in (CALL, END):
        if rest.startswith(marker):
            return Scan("done", (call,), j + len(marker))
    if rest.startswith(START) or (final and not rest):
        return Scan("done", (call,), j)
    if any(marker.startswith(rest) for marker in (CALL, END, START)):
        return Scan("done", (call,), len(text)) if final else wait(final)
    return FAIL
