"""Request bodies for /v1/chat/completions, /v1/completions and /v1/embeddings, validated strictly.

What no engine here can honour (n > 1, tools, logprobs, image parts, ...) is refused with a 400 that
names the parameter; nothing a client asked for is silently dropped. Unknown top-level fields that carry
no meaning for generation (e.g. `metadata` from chat frontends) are ignored, like OpenAI's own API does.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from gateway.errors import ErrorCode, GatewayError


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class _OtherPart(BaseModel):
    """Any non-text content part (image_url, input_audio, file): recognised only to be refused by name."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal["image_url", "input_audio", "file", "refusal"]


ContentPart = Annotated[TextPart | _OtherPart, Field(discriminator="type")]


class _Message(_Body):
    name: str | None = None

    def text(self) -> str:
        content = getattr(self, "content", None)
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(part.text for part in content if isinstance(part, TextPart))


class SystemMessage(_Message):
    role: Literal["system", "developer"]
    content: str | list[ContentPart]


class UserMessage(_Message):
    role: Literal["user"]
    content: str | list[ContentPart]


class AssistantMessage(_Message):
    role: Literal["assistant"]
    content: str | list[ContentPart] | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ToolMessage(_Message):
    role: Literal["tool", "function"]
    content: str | list[ContentPart] | None = None


Message = Annotated[SystemMessage | UserMessage | AssistantMessage | ToolMessage, Field(discriminator="role")]


class StreamOptions(_Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


Stop = Annotated[str, Field(min_length=1)]


class _Sampling(_Body):
    """Fields shared by chat and text completions; ranges as OpenAI documents them."""

    model: str = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1, le=128)
    stop: Stop | list[Stop] | None = None
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # Extensions understood by both engines (LMDeploy and our llama.cpp worker).
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool | None = None

    @field_validator("stop")
    @classmethod
    def _at_most_four_stops(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream"):
            raise ValueError("stream_options is only allowed when stream is true")
        return options

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, reason) for each requested feature no engine here can honour."""
        problems: list[tuple[str, str]] = []
        if self.n is not None and self.n > 1:
            problems.append(("n", "n > 1 is not supported; send several requests instead"))
        if self.logit_bias:
            problems.append(("logit_bias", "logit_bias is not supported"))
        return problems

    def token_limit(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None

    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.tools:
            problems.append(("tools", "tool calling is not supported by this model's engine"))
        if self.functions:
            problems.append(("functions", "function calling is not supported by this model's engine"))
        if self.tool_choice not in (None, "none") and not self.tools:
            problems.append(("tool_choice", "tool_choice needs tools, which are not supported"))
        if self.logprobs:
            problems.append(("logprobs", "logprobs are not supported yet"))
        if self.top_logprobs:
            problems.append(("top_logprobs", "logprobs are not supported yet"))
        if self.modalities and set(self.modalities) - {"text"}:
            problems.append(("modalities", "only text output is supported"))
        if self.audio:
            problems.append(("audio", "audio output is not supported"))
        if self.prediction:
            problems.append(("prediction", "predicted outputs are not supported"))
        if self.response_format is not None and self.response_format.type == "json_schema":
            problems.append(("response_format", 'json_schema is not supported; use {"type": "json_object"}'))
        for i, message in enumerate(self.messages):
            if isinstance(message, ToolMessage):
                problems.append((f"messages[{i}].role", f"role {message.role!r} needs tool support"))
            content = getattr(message, "content", None)
            if isinstance(content, list):
                for j, part in enumerate(content):
                    if isinstance(part, _OtherPart):
                        problems.append(
                            (
                                f"messages[{i}].content[{j}].type",
                                f"content parts of type {part.type!r} are not supported",
                            )
                        )
        return problems

    def engine_body(self) -> dict[str, Any]:
        """The request as sent to an engine: content flattened to strings, max_tokens resolved."""
        body = self.model_dump(exclude_none=True, exclude={"messages", "max_completion_tokens", "user"})
        body["messages"] = [{"role": m.role, "content": m.text()} for m in self.messages]
        limit = self.token_limit()
        if limit is not None:
            body["max_tokens"] = limit
        return body


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    echo: bool | None = None
    best_of: int | None = Field(default=None, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            problems.append(("prompt", "exactly one prompt per request is supported"))
        if self.echo:
            problems.append(("echo", "echo is not supported"))
        if self.best_of is not None and self.best_of > 1:
            problems.append(("best_of", "best_of > 1 is not supported"))
        if self.logprobs:
            problems.append(("logprobs", "logprobs are not supported yet"))
        if self.suffix:
            problems.append(("suffix", "suffix is not supported"))
        return problems

    def engine_body(self) -> dict[str, Any]:
        body = self.model_dump(exclude_none=True, exclude={"user", "echo", "best_of", "suffix"})
        if isinstance(self.prompt, list):
            body["prompt"] = self.prompt[0]
        return body


class EmbeddingRequest(_Body):
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    stream: Literal[False] = False  # embeddings are never streamed: `stream: true` is a 400

    def unsupported(self) -> list[tuple[str, str]]:
        return []

    def engine_body(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True, exclude={"user", "stream"})


InferenceRequest = ChatCompletionRequest | CompletionRequest | EmbeddingRequest
R = TypeVar("R", ChatCompletionRequest, CompletionRequest, EmbeddingRequest)


_TAGS = {"system", "developer", "user", "assistant", "tool", "function", "text", "image_url", "input_audio", "file",
         "refusal"}  # fmt: skip


def _param(loc: tuple[int | str, ...]) -> str | None:
    """pydantic's error location as a client-facing parameter path, e.g. `messages[0].content`."""
    out = ""
    previous: int | str | None = None
    for item in loc:
        if isinstance(item, int):
            out += f"[{item}]"
        elif item == "str" or "[" in item or (isinstance(previous, int) and item in _TAGS):
            pass  # union-branch labels and discriminator tags are pydantic's, not the client's
        else:
            out += ("." if out else "") + item
        previous = item
    return out or None


def parse_request(raw: bytes, model_type: type[R]) -> R:
    """Decode and validate a request body, or raise a 400 `GatewayError` naming the offending parameter."""
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise GatewayError(ErrorCode.INVALID_JSON, f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GatewayError(ErrorCode.INVALID_REQUEST, "request body must be a JSON object")
    try:
        request = model_type.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(tuple(first["loc"]))
        if first["type"] == "missing":
            message = f"missing required parameter: {param}"
        elif first["type"] == "union_tag_invalid":
            tag_field = str(first["ctx"]["discriminator"]).strip("'")
            value = first["input"].get(tag_field) if isinstance(first["input"], dict) else first["input"]
            param = f"{param}.{tag_field}" if param else tag_field
            message = f"{param}: unsupported value {value!r} (expected {first['ctx']['expected_tags']})"
        else:
            message = f"{param}: {first['msg']}" if param else first["msg"]
        raise GatewayError(ErrorCode.INVALID_REQUEST, message, param=param) from None
    problems = request.unsupported()
    if problems:
        param, reason = problems[0]
        raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, reason, param=param)
    return request
