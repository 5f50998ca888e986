"""Decoding a request body as JSON that every later step can handle: a 400 (never a 500 further on) for
what JSON allows but no request may carry.

    not UTF-8 / not JSON            400 invalid_json
    NaN, Infinity, 1e400            400 invalid_json (JSON has no such numbers; they cannot be sent on)
    nested deeper than MAX_DEPTH    400 invalid_request_error naming the parameter where it got too deep
    a lone UTF-16 surrogate         400 invalid_request_error naming the parameter ("\\ud800" is valid JSON
                                    but no Unicode text: it cannot be encoded for the model)

The checks are cheap: containers are walked for depth (level by level, about 50 us for a body with 30
tools) only when the raw bytes hold more brackets than the limit, and strings only when the raw bytes hold
a `\\uD800`-`\\uDFFF` escape (a surrogate pair passes: it decodes to one character).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gateway.errors import ErrorCode, GatewayError

MAX_DEPTH = 64
"""Objects and arrays nested deeper than this are refused: no real request comes near it (a tool's JSON schema
nested 25 levels is about 55), and deeper structures overflow recursive code further on."""

_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]} is out of range")
    return value


_DECODER = json.JSONDecoder(parse_constant=_constant, parse_float=_finite)
"""Made once: `json.loads` with these hooks would build a decoder and its scanner on every request."""


def load_json(raw: bytes, *, dotted: bool = False) -> Any:
    """`raw` decoded, or a 400 `GatewayError` (see the module docstring); `dotted` names parameters
    Anthropic's way (`messages.0.content`) instead of OpenAI's (`messages[0].content`)."""
    try:
        data = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))  # as json.loads does
    except RecursionError:
        raise _too_deep(None) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"request body is not valid JSON: {exc}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _deeper_than_limit(data):
        raise _too_deep(_path_to_depth(data, MAX_DEPTH + 1, dotted))
    if _SURROGATE_ESCAPE.search(raw):
        _check_strings(data, dotted)
    return data


def _too_deep(param: str | None) -> GatewayError:
    where = f" at {param}" if param else ""
    message = f"request body is nested deeper than {MAX_DEPTH} levels{where}"
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


def _join(path: str, key: str | int, dotted: bool) -> str:
    if isinstance(key, int) and not dotted:
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def _surrogate(path: str, text: str) -> GatewayError:
    found = _SURROGATE.search(text)
    assert found is not None
    message = (
        f"{path or 'request body'}: contains a lone UTF-16 surrogate (\\u{ord(found.group()):04x}), which is "
        "not valid Unicode text"
    )
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=path or None)


def _deeper_than_limit(data: Any) -> bool:
    """Whether containers nest deeper than `MAX_DEPTH`: level by level, containers only, no recursion."""
    level, depth = [data], 1
    while level:
        if depth > MAX_DEPTH:
            return True
        below = []
        for node in level:
            for value in node.values() if type(node) is dict else node:
                if type(value) is dict or type(value) is list:
                    below.append(value)
        level, depth = below, depth + 1
    return False


def _path_to_depth(data: Any, depth: int, dotted: bool) -> str | None:
    """The parameter path of the first container at `depth` (1: the body itself), for the error message."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        node, level, path = stack.pop()
        if level >= depth:
            return path or None
        items = list(node.items() if isinstance(node, dict) else enumerate(node))
        stack.extend((v, level + 1, _join(path, k, dotted)) for k, v in reversed(items) if isinstance(v, dict | list))
    return None


def _check_strings(data: Any, dotted: bool) -> None:
    """The first string (key or value) holding a lone surrogate, as a 400 naming its parameter path."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise _surrogate(path, node)
            continue
        items = list(node.items() if isinstance(node, dict) else enumerate(node))
        for key, _ in items:
            if isinstance(key, str) and _SURROGATE.search(key):
                raise _surrogate(_join(path, key, dotted), key)
        stack.extend((v, _join(path, k, dotted)) for k, v in reversed(items) if isinstance(v, str | dict | list))
