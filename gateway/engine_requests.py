"""From a validated OpenAI request to the one typed `EngineRequest` every worker accepts.

Mapping that belongs to the gateway happens here, once: the `developer` role becomes `system` (every chat
template knows `system`), content parts are flattened to text, `max_completion_tokens` wins over
`max_tokens`, the server's length defaults apply, the engine is always asked for usage when streaming
(for exact token metrics), and the public model name becomes the one the worker knows.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from backends.request import EngineMessage, EngineRequest
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
    return EngineMessage(role=role, content=message.text(), name=message.name)


def _sampling(parsed: ChatCompletionRequest | CompletionRequest) -> dict[str, Any]:
    fields = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty",
              "repetition_penalty")  # fmt: skip
    out = {name: getattr(parsed, name) for name in fields if getattr(parsed, name) is not None}
    if parsed.ignore_eos:
        out["ignore_eos"] = True
    return out


def build_engine_request(
    parsed: ChatCompletionRequest | CompletionRequest,
    *,
    model: str,
    default_max_tokens: int | None = None,
) -> EngineRequest:
    """The engine request for `parsed`; a combination the engine request refuses is a 400 naming it."""
    body: dict[str, Any] = {"model": model, "stream": parsed.stream, "stop": parsed.stops(), **_sampling(parsed)}
    if parsed.stream:
        body["stream_options"] = {"include_usage": True}
    limit = parsed.token_limit()
    if limit is None:
        limit = default_max_tokens
    if limit is not None:
        body["max_tokens"] = limit
    if isinstance(parsed, ChatCompletionRequest):
        body["messages"] = tuple(_message(m) for m in parsed.messages)
        body["continue_final_message"] = parsed.continues_reply
        body["response_format"] = parsed.response_format
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
