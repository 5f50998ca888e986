"""Response bodies the gateway emits, with OpenAI's exact field names and required fields.

Non-streaming answers from any engine are parsed into these models and re-emitted, so clients see one
shape whichever engine served them (e.g. `refusal` on messages, exact `usage`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CompletionUsage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, Any] | None = None


class FunctionCall(_Out):
    name: str
    arguments: str


class ToolCall(_Out):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatCompletionMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Out):
    index: int = 0
    message: ChatCompletionMessage
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason = "stop"


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: CompletionUsage | None = None

    def wire(self) -> dict[str, Any]:
        """JSON as OpenAI sends it: `content`/`refusal`/`logprobs` are null when empty, `tool_calls` absent."""
        body = self.model_dump(mode="json")
        for choice in body["choices"]:
            if choice["message"].get("tool_calls") is None:
                choice["message"].pop("tool_calls", None)
        return body


class ToolCallDelta(_Out):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, str] | None = None


class ChunkDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Out):
    index: int = 0
    delta: ChunkDelta
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(_Out):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: CompletionUsage | None = None


class CompletionChoice(_Out):
    index: int = 0
    text: str
    logprobs: dict[str, Any] | None = None
    finish_reason: FinishReason = "stop"


class Completion(_Out):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage | None = None


class Model(_Out):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "voltgate"
    capabilities: dict[str, bool] | None = Field(default=None, description="voltgate extension: what it can do")
    engine: str | None = Field(default=None, description="voltgate extension: the engine serving it")
    task: Literal["generate", "embed", "rerank"] | None = Field(
        default=None, description="voltgate extension: what it serves (generate: chat and completions)"
    )


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[Model] = Field(default_factory=list)
