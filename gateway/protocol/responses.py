"""Response bodies the gateway emits, with OpenAI's exact field names and required fields.

Non-streaming answers from any engine are parsed into these models and re-emitted, so clients see one
shape whichever engine served them (e.g. `refusal` on messages, exact `usage`). A non-streamed chat answer is
parsed once into `ChatCompletion`, which each API renders: chat clients get `ChatCompletion.wire()`, Messages
and Responses clients their translator's rendering of the same typed object (`gateway.translate`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, BeforeValidator, ConfigDict, Field

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CompletionUsage(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    # Relayed as the engine sent them, and left out when it sent none (OpenAI's schema: an object or absent).
    prompt_tokens_details: dict[str, Any] | None = Field(default=None, exclude_if=lambda v: v is None)
    completion_tokens_details: dict[str, Any] | None = Field(  # `reasoning_tokens` counts the thinking
        default=None, exclude_if=lambda v: v is None
    )

    @property
    def cached_tokens(self) -> int | None:
        """The prompt tokens served from the engine's prefix cache; None when the engine does not say (docs/api.md,
        "Cached tokens": LMDeploy's answers have their details removed, a 0 there is not measured)."""
        cached = (self.prompt_tokens_details or {}).get("cached_tokens")
        return cached if isinstance(cached, int) else None

    @property
    def reasoning_tokens(self) -> int:
        """The completion tokens the model spent thinking (0 when the engine does not say)."""
        return int((self.completion_tokens_details or {}).get("reasoning_tokens") or 0)


def _stop_match(value: object) -> object:
    return value if isinstance(value, str | int) else None  # an engine's other value says nothing we can use


StopMatch = Annotated[str | int | None, BeforeValidator(_stop_match)]
"""The stop an OpenAI-compatible peer says it matched: vLLM's `stop_reason`, SGLang's `matched_stop` (the stop
string, or a stop token's id); None when the answer ended otherwise or the engine does not say."""


class _Matched(_Out):
    """A choice's matched stop, read from vLLM's and SGLang's extensions and left out of every dump (`exclude`):
    a non-streamed chat body has OpenAI's fields only (a chat stream is relayed as the engine sent it); the
    Messages API reports the string as `stop_sequence`."""

    stop_reason: StopMatch = Field(default=None, exclude=True, description="the stop matched (vLLM's extension)")
    matched_stop: StopMatch = Field(default=None, exclude=True, description="the stop matched (SGLang's extension)")

    @property
    def matched(self) -> str | int | None:
        """The stop string an upstream says it matched, when it says so."""
        return self.stop_reason or self.matched_stop


class FunctionCall(_Out):
    name: str
    arguments: str


class ToolCall(_Out):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


REASONING = AliasChoices("reasoning_content", "reasoning")
"""An answer's thinking: llama.cpp's, LMDeploy's and SGLang's name, or vLLM's and Ollama's since 2026."""

ReasoningField = Literal["reasoning_content", "reasoning"]


class ChatCompletionMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = Field(default=None, validation_alias=REASONING)
    refusal: str | None = None
    tool_calls: list[ToolCall] | None = None


class ChatChoice(_Matched):
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

    @property
    def choice(self) -> ChatChoice:
        """The first choice, which the translated APIs render (they ask for one); an empty message ending
        "stop" when the engine sent none."""
        return self.choices[0] if self.choices else ChatChoice(message=ChatCompletionMessage())

    def wire(self, reasoning_field: ReasoningField = "reasoning_content") -> dict[str, Any]:
        """JSON as OpenAI sends it: `content`/`refusal`/`logprobs` are null when empty, `tool_calls` and the
        usage details the engine did not send absent (`CompletionUsage`); the thinking, when there is any, under
        `reasoning_field`."""
        body = self.model_dump(mode="json")
        for choice in body["choices"]:
            message = choice["message"]
            if message.get("tool_calls") is None:
                message.pop("tool_calls", None)
            thinking = message.pop("reasoning_content", None)
            if thinking is not None:
                message[reasoning_field] = thinking
        return body


# A streamed chunk is read by the translated APIs (Responses, Messages) from whichever engine answered, so
# these types take what an OpenAI-compatible upstream may leave out (envelope fields, a tool call's index,
# an engine's own finish reason) rather than lose a token of the answer over it.


class FunctionDelta(_Out):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(_Out):
    index: int = 0
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta | None = None


class ChunkDelta(_Out):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = Field(default=None, validation_alias=REASONING)
    refusal: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Matched):
    index: int = 0
    delta: ChunkDelta = ChunkDelta()
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(_Out):
    id: str = ""
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = 0
    model: str | None = None
    choices: list[ChunkChoice] = []
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
    aliases: list[str] | None = Field(default=None, description="voltgate extension: other names that reach it")
    alias_patterns: list[str] | None = Field(
        default=None, description="voltgate extension: glob patterns of names that reach it (docs/configuration.md)"
    )
    reasoning: dict[str, Any] | None = Field(
        default=None,
        description="voltgate extension: the model's reasoning default (effort, budget_tokens, budget_message, field)",
    )


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[Model] = Field(default_factory=list)
