"""JSON inside generated text: where a value ends (or that it has not ended yet), and reading it."""

from __future__ import annotations

import json
import re
from typing import Any

INCOMPLETE = -1
"""`value_end`'s answer when the text stops before the value does."""

INVALID = -2
"""`value_end`'s answer when no JSON value can start or continue here."""

_SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null")
_CLOSERS = {"{": "}", "[": "]"}


def value_end(text: str, start: int) -> int:
    """The index just past the JSON value that begins at `start`, INCOMPLETE, or INVALID.

    Objects and arrays are matched bracket by bracket (strings and escapes respected) without being
    parsed, so a value that is merely unfinished is told apart from one that is malformed; whether the
    balanced text is valid JSON is for `loads` to say. A scalar ends at the first character that cannot
    continue it, so one that reaches the end of `text` is INCOMPLETE.
    """
    if start >= len(text):
        return INCOMPLETE
    head = text[start]
    if head == '"':
        return _string_end(text, start)
    if head in _CLOSERS:
        return _container_end(text, start)
    match = _SCALAR.match(text, start)
    if match is None:
        rest = text[start:]
        maybe = any(word.startswith(rest) for word in ("true", "false", "null")) or rest == "-"
        return INCOMPLETE if maybe else INVALID
    return INCOMPLETE if match.end() == len(text) else match.end()


def _string_end(text: str, start: int) -> int:
    i = start + 1
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == '"':
            return i + 1
        i += 1
    return INCOMPLETE


def _container_end(text: str, start: int) -> int:
    expected: list[str] = []
    i = start
    while i < len(text):
        char = text[i]
        if char == '"':
            end = _string_end(text, i)
            if end == INCOMPLETE:
                return INCOMPLETE
            i = end
            continue
        if char in _CLOSERS:
            expected.append(_CLOSERS[char])
        elif char in "}]":
            if not expected or expected.pop() != char:
                return INVALID
            if not expected:
                return i + 1
        i += 1
    return INCOMPLETE


def loads(text: str) -> Any:
    """The JSON value in `text`, or None if it is not JSON (a JSON `null` reads as None too)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def compact(value: Any) -> str:
    """`value` as compact JSON text, non-ASCII characters kept as they are."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
