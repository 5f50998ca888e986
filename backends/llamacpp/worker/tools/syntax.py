"""How each family writes a tool call in generated text, and the one-shot parse built on it.

A `CallSyntax` knows the openers of a call (`triggers`, and for Llama 3 a JSON object at the very start of
the output) and reads one call block that begins at an opener with `scan`. `scan` answers MORE (the block
is unfinished: wait for text), FAIL (it is not a well-formed call of a known tool, whatever follows) or
done with the calls and the block's length. Answers only ever depend on the text read so far, so the
streaming parser (`stream.py`) and `parse_output` agree.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Set
from dataclasses import dataclass
from typing import Any, Literal

from backends.llamacpp.worker.tools.calls import ParsedCall, ParsedOutput
from backends.llamacpp.worker.tools.jsontext import INCOMPLETE, INVALID, compact, loads, value_end

_NAME = re.compile(r"[A-Za-z0-9_.:-]+")
_CALL_ID = re.compile(r"[A-Za-z0-9]+")
# A forced call cut short: what every call grammar writes before the arguments (`grammar.py`), then the rest;
# or cut inside the tool's name.
_TRUNCATED_CALLS = (
    re.compile(r'"name"\s*:\s*"([^"\\]+)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(.*)\Z', re.DOTALL),
    re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.:-]+)(?:\[CALL_ID\][A-Za-z0-9]*)?\[ARGS\](.*)\Z", re.DOTALL),
)
_TRUNCATED_NAMES = (re.compile(r'"name"\s*:\s*"([^"\\]*)\Z'), re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.:-]*)\Z"))


@dataclass(frozen=True)
class Scan:
    """What `CallSyntax.scan` found at an opener."""

    status: Literal["more", "fail", "done"]
    calls: tuple[ParsedCall, ...] = ()
    end: int = 0


MORE = Scan("more")
FAIL = Scan("fail")


def wait(final: bool) -> Scan:
    """An unfinished block: wait for more text, unless generation has ended (then it is truncated)."""
    return FAIL if final else MORE


def skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i].isspace():
        i += 1
    return i


def json_at(text: str, i: int, final: bool) -> tuple[Any, int] | Scan:
    """The JSON value at `i` and the index after it, or the Scan to answer when there is none (yet)."""
    end = value_end(text, i)
    if end == INCOMPLETE:
        return wait(final)
    if end == INVALID:
        return FAIL
    return loads(text[i:end]), end


def make_call(name: Any, arguments: Any, names: Set[str]) -> ParsedCall | None:
    """A call of a known tool with object arguments (absent arguments are `{}`), or None."""
    if not isinstance(name, str) or name not in names:
        return None
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):  # some models write the arguments as a JSON string
        arguments = loads(arguments)
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name, compact(arguments))


def call_from_object(value: Any, names: Set[str], argument_keys: tuple[str, ...]) -> ParsedCall | None:
    """A call written as one JSON object: {"name": ..., <one of argument_keys>: {...}}."""
    if not isinstance(value, dict):
        return None
    if value.get("type", "function") != "function":
        return None
    arguments = next((value[k] for k in argument_keys if k in value), None)
    return make_call(value.get("name"), arguments, names)


class CallSyntax(ABC):
    """One family's way of writing tool calls."""

    triggers: tuple[str, ...] = ()
    leading_json: bool = False
    """A JSON object that starts the output (after whitespace) opens a call too (Llama 3)."""

    def find_opener(self, text: str, pos: int, *, at_start: bool) -> int:
        """Index of the first opener at or after `pos`, or -1. `at_start`: nothing precedes `text`."""
        if at_start and self.leading_json and pos == 0:
            stripped = text.lstrip()
            if stripped.startswith("{"):
                return len(text) - len(stripped)
        found = [i for i in (text.find(t, pos) for t in self.triggers) if i >= 0]
        return min(found, default=-1)

    def partial_opener(self, text: str, *, at_start: bool) -> int:
        """Length of the longest suffix of `text` that could still grow into an opener."""
        if at_start and self.leading_json and not text.strip():
            return len(text)
        longest = 0
        for trigger in self.triggers:
            for n in range(min(len(trigger) - 1, len(text)), longest, -1):
                if text.endswith(trigger[:n]):
                    longest = n
                    break
        return longest

    @abstractmethod
    def scan(self, text: str, names: Set[str], *, final: bool) -> Scan:
        """Read the call block at the start of `text` (which starts with an opener)."""

    def truncated_call(self, text: str, names: Set[str]) -> ParsedCall | None:
        """The call an unfinished block (`text`, from its opener) was writing when generation stopped: its
        tool and its arguments so far, which are no complete JSON (`""` when it stopped before them, and
        inside the name the one tool whose name starts so). None when no single tool is known yet.

        Only for output held to a call grammar (`tool_choice` "required" or a named tool): the grammar
        writes the name before the arguments in every syntax, so a block cut by max_tokens is still a call
        (OpenAI answers such a call with `finish_reason: "length"` and its arguments cut short, too)."""
        for pattern in _TRUNCATED_CALLS:
            found = pattern.search(text)
            if found is not None and found.group(1) in names:
                return ParsedCall(found.group(1), found.group(2).rstrip())
        for pattern in _TRUNCATED_NAMES:
            found = pattern.search(text)
            candidates = [name for name in names if found is not None and name.startswith(found.group(1))]
            if len(candidates) == 1:
                return ParsedCall(candidates[0], "")
        return None


def parse_output(syntax: CallSyntax, text: str, names: Set[str]) -> ParsedOutput:
    """Every call in `text` and the text around them; the whole text as content if any call is bad."""
    parts: list[str] = []
    calls: list[ParsedCall] = []
    pos = 0
    while (start := syntax.find_opener(text, pos, at_start=pos == 0)) >= 0:
        scan = syntax.scan(text[start:], names, final=True)
        if scan.status != "done":
            return ParsedOutput(text.strip() or None, [])
        parts.append(text[pos:start])
        calls.extend(scan.calls)
        pos = start + scan.end
    parts.append(text[pos:])
    return ParsedOutput("".join(parts).strip() or None, calls)


class HermesSyntax(CallSyntax):
    """`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, once per call (Hermes, Qwen2.5, generic).

    A missing closing tag is forgiven at the end of the output when the JSON itself is complete.
    """

    OPEN = "<tool_call>"
    CLOSE = "</tool_call>"
    triggers = (OPEN,)

    def scan(self, text: str, names: Set[str], *, final: bool) -> Scan:
        i = skip_space(text, len(self.OPEN))
        if i == len(text):
            return wait(final)
        if text[i] != "{":
            return FAIL
        found = json_at(text, i, final)
        if isinstance(found, Scan):
            return found
        value, end = found
        call = call_from_object(value, names, ("arguments", "parameters"))
        if call is None:
            return FAIL
        j = skip_space(text, end)
        rest = text[j:]
        if rest.startswith(self.CLOSE):
            return Scan("done", (call,), j + len(self.CLOSE))
        if self.CLOSE.startswith(rest):
            return Scan("done", (call,), len(text)) if final else MORE
        return FAIL


class MistralSyntax(CallSyntax):
    """`[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (v3 tokenizers: Mistral 7B v0.3, Nemo) or
    `[TOOL_CALLS]name[ARGS]{...}` with an optional `[CALL_ID]id` before `[ARGS]` (v11+: Small 3.2, Devstral,
    Magistral), one `[TOOL_CALLS]` per call. Both forms are read whatever the template."""

    OPEN = "[TOOL_CALLS]"
    triggers = (OPEN,)

    def scan(self, text: str, names: Set[str], *, final: bool) -> Scan:
        i = skip_space(text, len(self.OPEN))
        if i == len(text):
            return wait(final)
        if text[i] in "[{":
            return self._scan_json(text, i, names, final)
        return self._scan_named(text, i, names, final)

    @staticmethod
    def _scan_json(text: str, i: int, names: Set[str], final: bool) -> Scan:
        found = json_at(text, i, final)
        if isinstance(found, Scan):
            return found
        value, end = found
        items = value if isinstance(value, list) else [value]
        calls = [call_from_object(item, names, ("arguments", "parameters")) for item in items]
        if not calls or any(c is None for c in calls):
            return FAIL
        return Scan("done", tuple(c for c in calls if c is not None), end)

    @staticmethod
    def _scan_named(text: str, i: int, names: Set[str], final: bool) -> Scan:
        name = _NAME.match(text, i)
        if name is None:
            return FAIL
        j = _after_literal(text, name.end(), "[CALL_ID]")
        if j is None:
            return wait(final)
        if j > name.end():
            call_id = _CALL_ID.match(text, j)
            if call_id is None or call_id.end() == len(text):
                return FAIL if call_id is None and j < len(text) else wait(final)
            j = call_id.end()
        k = _after_literal(text, j, "[ARGS]")
        if k is None:
            return wait(final)
        if k == j:
            return FAIL
        k = skip_space(text, k)
        if k == len(text):
            return wait(final)
        if text[k] != "{":
            return FAIL
        found = json_at(text, k, final)
        if isinstance(found, Scan):
            return found
        arguments, end = found
        call = make_call(name.group(), arguments, names)
        return FAIL if call is None else Scan("done", (call,), end)


def _after_literal(text: str, i: int, literal: str) -> int | None:
    """The index after `literal` at `i`; `i` itself when it is not there; None if the text is a prefix of it."""
    rest = text[i:]
    if rest.startswith(literal):
        return i + len(literal)
    return None if literal.startswith(rest) else i
