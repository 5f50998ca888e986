"""From a validated OpenAI request to the one typed `EngineRequest` every worker accepts.

Mapping that belongs to the gateway happens here, once: the `developer` role becomes `system` (every chat
template knows `system`), content parts are flattened to text (an image part leaves `IMAGE_MARKER`; the
images, checked by `gateway.vision_parts`, ride in `images`), `max_completion_tokens` wins over
`max_tokens`, the server's length defaults apply, the engine is always asked for usage when streaming
(for exact token metrics), and the public model name becomes the one the worker knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from backends.request import EngineImage, EngineMessage, EngineRequest
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.requests import (
    AssistantMessage,
    ChatCompletionRequest,
    CompletionRequest,
    ToolMessage,
    validation_error,
)


def _message(message: Any) -> EngineMessage:
    role = "system" if message.role == "developer" else message.role
    if isinstance(message, AssistantMessage):
        calls = tuple(message.tool_calls) if message.tool_calls else None
        content = message.text() if message.content is not None else None
        return EngineMessage(role="assistant", content=content, name=message.name, tool_calls=calls)
    if isinstance(message, ToolMessage):
        return EngineMessage(role="tool", content=message.text(), tool_call_id=message.tool_call_id)
    if role == "user":
        return EngineMessage(role=role, content=message.text_with_images(), name=message.name)
    return EngineMessage(role=role, content=message.text(), name=message.name)


def _sampling(parsed: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    fields = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
              "repetition_penalty")  # fmt: skip
    out = {name: getattr(parsed, name) for name in fields if getattr(parsed, name) is not None}
    if parsed.ignore_eos:
        out["ignore_eos"] = True
    if parsed.n is not None:
        out["n"] = parsed.n
    if parsed.logit_bias:
        out["logit_bias"] = parsed.logit_bias
    if isinstance(parsed, CompletionRequest):
        if parsed.logprobs is not None:  # the legacy integer: that many alternatives per token
            out["logprobs"], out["top_logprobs"] = True, parsed.logprobs
    elif parsed.logprobs:
        out["logprobs"], out["top_logprobs"] = True, parsed.top_logprobs
    return out


def token_limit(
    parsed: ChatCompletionRequest | CompletionRequest,
    *,
    default_max_tokens: int | None = None,
    cap: int | None = None,
    clamp: bool = False,
) -> int | None:
    """max_tokens for the engine: the request's, else the model's default, else the server's cap; a
    request over the cap is a 400 naming the field it sent, or (`clamp`) is served with the cap."""
    limit = parsed.token_limit()
    if limit is not None and cap is not None and limit > cap:
        if clamp:
            return cap
        param = "max_completion_tokens" if getattr(parsed, "max_completion_tokens", None) else "max_tokens"
        raise GatewayError(ErrorCode.INVALID_REQUEST, f"{param} {limit} exceeds this server's cap of {cap}",
                           param=param)  # fmt: skip
    if limit is None:
        limit = default_max_tokens if default_max_tokens is not None else cap
    if limit is not None and cap is not None:
        limit = min(limit, cap)
    return limit


def build_engine_request(
    parsed: ChatCompletionRequest | CompletionRequest,
    *,
    model: str,
    max_tokens: int | None = None,
    defaults: Mapping[str, float | int] | None = None,
    images: tuple[EngineImage, ...] = (),
) -> EngineRequest:
    """The engine request for `parsed` (with `max_tokens` from `token_limit`, and the model's sampling
    `defaults` for the fields it leaves out); a combination the engine request refuses is a 400 naming it."""
    sampling = {**(defaults or {}), **_sampling(parsed)}
    body: dict[str, Any] = {"model": model, "stream": parsed.stream, "stop": parsed.stops(), **sampling}
    if parsed.stream:
        body["stream_options"] = {"include_usage": True}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if isinstance(parsed, ChatCompletionRequest):
        body["messages"] = tuple(_message(m) for m in parsed.messages)
        body["continue_final_message"] = parsed.continues_reply
        body["response_format"] = parsed.response_format
        body["images"] = images
        if parsed.tools:
            body["tools"] = tuple(parsed.tools)
            body["tool_choice"] = parsed.tool_choice
            body["parallel_tool_calls"] = parsed.parallel_tool_calls
    else:
        body["prompt"] = parsed.prompt_text()
    try:
        return EngineRequest.model_validate(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
