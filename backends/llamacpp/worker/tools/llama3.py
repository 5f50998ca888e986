"""Llama 3.x's call syntax: a JSON object with "parameters" as the whole reply, or after <|python_tag|>."""

from __future__ import annotations

import re
from collections.abc import Set
from typing import Any

from backends.llamacpp.worker.tools.syntax import (
    FAIL,
    CallSyntax,
    Scan,
    call_from_object,
    json_at,
    make_call,
    skip_space,
    wait,
)

PYTHON_TAG = "<|python_tag|>"

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_KEYWORD = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*")
_PARTIAL_KEYWORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\s*$")
_FIRST_KEYS = ('"name"', '"type"')


class Llama3Syntax(CallSyntax):
    """`{"name": ..., "parameters": {...}}` opening the reply (Llama 3.1/3.2/3.3 custom tools), the same
    after `<|python_tag|>`, or `<|python_tag|>tool.call(key="value", ...)` (3.1's built-in tools).

    Llama 3 makes one call per reply; text after the call's JSON is content.
    """

    triggers = (PYTHON_TAG,)
    leading_json = True

    def scan(self, text: str, names: Set[str], *, final: bool) -> Scan:
        i = 0
        if text.startswith(PYTHON_TAG):
            i = skip_space(text, len(PYTHON_TAG))
            if i == len(text):
                return wait(final)
            if text[i] != "{":
                return _scan_builtin(text, i, names, final)
        if not _could_be_call(text, i):
            return FAIL
        found = json_at(text, i, final)
        if isinstance(found, Scan):
            return found
        value, end = found
        call = call_from_object(value, names, ("parameters", "arguments"))
        return FAIL if call is None else Scan("done", (call,), end)


def _scan_builtin(text: str, i: int, names: Set[str], final: bool) -> Scan:
    """`tool.call(key=<JSON value>, ...)` at `i`."""
    head = _IDENTIFIER.match(text, i)
    if head is None or not text.startswith(".call(", head.end()):
        rest = text[head.end() :] if head else text[i:]
        return wait(final) if head is not None and ".call(".startswith(rest) else FAIL
    arguments: dict[str, Any] = {}
    j = skip_space(text, head.end() + len(".call("))
    while j == len(text) or text[j] != ")":
        keyword = _KEYWORD.match(text, j)
        if keyword is None:
            return wait(final) if _PARTIAL_KEYWORD.match(text, j) or j == len(text) else FAIL
        found = json_at(text, keyword.end(), final)
        if isinstance(found, Scan):
            return found
        arguments[keyword.group(1)], j = found
        j = skip_space(text, j)
        if j == len(text):
            return wait(final)
        if text[j] == ",":
            j = skip_space(text, j + 1)
        elif text[j] != ")":
            return FAIL
    call = make_call(head.group(), arguments, names)
    return FAIL if call is None else Scan("done", (call,), j + 1)


def _could_be_call(text: str, i: int) -> bool:
    """Whether the object at `i` may still be a call: its first key must be "name" or "type"."""
    rest = text[skip_space(text, i + 1) :]
    return any(rest.startswith(key) or key.startswith(rest) for key in _FIRST_KEYS)
