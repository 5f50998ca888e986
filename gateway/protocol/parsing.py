"""Decoding a request body into its pydantic model, or a 400 naming the parameter: one function for every
API (chat and text completions, embeddings, rerank, Responses, Messages).

pydantic's error locations carry union-branch labels and discriminator tags; `param_path` drops them so the
client sees its own parameter path (`messages[0].content[1].type`, or Anthropic's `messages.0.content`).
"""

from __future__ import annotations

from typing import Any, Protocol, Self, TypeVar

from pydantic import ValidationError

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.json_body import load_json


class _Request(Protocol):
    """A pydantic request model that names what it asks for but no engine can honour."""

    @classmethod
    def model_validate(cls, obj: Any) -> Self: ...

    def unsupported(self) -> list[tuple[str, str]]: ...


R = TypeVar("R", bound=_Request)

# Discriminator tags of the translated APIs' unions, and the fields that hold a single tagged union.
_TAGS = frozenset(
    {"message", "function_call", "function_call_output", "reasoning", "other", "input_text", "output_text",
     "refusal", "function", "mode", "text", "json_object", "json_schema", "tool_use", "tool_result", "auto",
     "any", "tool", "none", "disabled", "enabled", "adaptive", "custom", "image",
     "system", "developer", "user", "assistant", "image_url", "input_audio", "file"}
)  # fmt: skip
_TAGGED_FIELDS = frozenset({"tool_choice", "format", "thinking"})
_BRANCH_LABELS = frozenset({"str", "int", "float", "bool"})


def param_path(loc: tuple[int | str, ...], *, dotted: bool = False) -> str | None:
    """pydantic's error location as the client's parameter path: `input[2].content[0].text` (OpenAI's
    style) or, `dotted`, `messages.2.content.0.text` (Anthropic's)."""
    out = ""
    for i, item in enumerate(loc):
        previous = loc[i - 1] if i else None
        # After a list index a tag is followed by the field inside it; a last element there is a field.
        is_tag = item in _TAGS and (previous in _TAGGED_FIELDS or (isinstance(previous, int) and i < len(loc) - 1))
        if isinstance(item, int):
            out += f".{item}" if dotted else f"[{item}]"
        elif item in _BRANCH_LABELS or "[" in item or is_tag:
            continue  # union-branch labels and discriminator tags are pydantic's, not the client's
        else:
            out += ("." if out else "") + item
    return out or None


def validation_error(exc: ValidationError, *, dotted: bool = False, at: tuple[int | str, ...] = ()) -> GatewayError:
    """The most specific of pydantic's errors (the deepest location) as a 400 naming the parameter; `at` is
    where the model that failed sits in the request (a part built on its own, e.g. `("tools", 0, "function")`)."""
    first = max(exc.errors(), key=lambda e: len(e["loc"]))
    param = param_path((*at, *first["loc"]), dotted=dotted)
    if first["type"] == "missing":
        message = f"missing required parameter: {param}"
    elif first["type"] == "union_tag_invalid":
        tag_field = str(first["ctx"]["discriminator"]).strip("'")
        value = first["input"].get(tag_field) if isinstance(first["input"], dict) else first["input"]
        param = f"{param}.{tag_field}" if param else tag_field
        message = f"{param}: unsupported value {value!r} (expected {first['ctx']['expected_tags']})"
    else:
        message = f"{param}: {first['msg']}" if param else str(first["msg"])
    return GatewayError(ErrorCode.INVALID_REQUEST, message, param=param)


def parse_body(raw: bytes, model_type: type[R], *, dotted: bool = False) -> R:
    """Decode `raw` (`gateway.protocol.json_body`: no NaN, no lone surrogate, bounded depth), validate it,
    then refuse the first `unsupported()` feature, each as a 400 `GatewayError` naming the parameter
    (`dotted` paths for Anthropic's API)."""
    data = load_json(raw, dotted=dotted)
    if not isinstance(data, dict):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "request body must be a JSON object")
    try:
        request = model_type.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, dotted=dotted) from None
    return supported(request)


def supported(request: R) -> R:
    """`request`, or a 400 `GatewayError` for the first feature it asks for that no engine here can honour."""
    problems = request.unsupported()
    if problems:
        param, reason = problems[0]
        raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, reason, param=param)
    return request
