"""Decoding a request body as JSON that every later step can handle: a 400 (never a 500 further on) for
what JSON allows but no request may carry.

    not UTF-8 / not JSON            400 invalid_json
    NaN, Infinity, 1e400            400 invalid_json (JSON has no such numbers; they cannot be sent on)
    nested deeper than MAX_DEPTH    400 invalid_request_error naming the parameter where it got too deep
    a lone UTF-16 surrogate         400 invalid_request_error naming the parameter ("\\ud800" is valid JSON
                                    but no Unicode text: it cannot be encoded for the model)

The checks cost nothing for an ordinary body: the structure is walked only when the raw bytes hold more
brackets than the depth limit or a `\\uD800`-`\\uDFFF` escape (a surrogate pair is fine: it decodes to one
character, so the walk finds nothing).
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


def load_json(raw: bytes, *, dotted: bool = False) -> Any:
    """`raw` decoded, or a 400 `GatewayError` (see the module docstring); `dotted` names parameters
    Anthropic's way (`messages.0.content`) instead of OpenAI's (`messages[0].content`)."""
    try:
        data = json.loads(raw, parse_constant=_constant, parse_float=_finite)
    except RecursionError:
        raise _too_deep(None) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"request body is not valid JSON: {exc}") from None
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH or _SURROGATE_ESCAPE.search(raw):
        _check(data, dotted)
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


def _check(data: Any, dotted: bool) -> None:
    """Walk `data` without recursion: the first container past `MAX_DEPTH`, or string (key or value) with a
    lone surrogate, as a 400 naming its parameter path."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        node, depth, path = stack.pop()
        if isinstance(node, str):
            if _SURROGATE.search(node):
                raise _surrogate(path, node)
            continue
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise _too_deep(path or None)
        items = node.items() if isinstance(node, dict) else enumerate(node)
        children = []
        for key, value in items:
            child = _join(path, key, dotted)
            if isinstance(key, str) and _SURROGATE.search(key):
                raise _surrogate(child, key)
            if isinstance(value, str | dict | list):
                children.append((value, depth + 1, child))
        stack.extend(reversed(children))
