"""What the Messages API sends, typed: the Message, its content blocks and the stream's events, as Anthropic
names them (vLLM's `entrypoints/anthropic/protocol.py` models the same objects). The translation
(`gateway.translate.messages`, `messages_stream`) builds only these; each is turned into JSON once, by
`wire()`, where it leaves the translation.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def wire(self) -> dict[str, Any]:
        """The JSON object Anthropic sends (a None field is `null`)."""
        return self.model_dump(mode="json")


# -- content blocks -------------------------------------------------------------------------------------
class TextContent(_Wire):
    type: Literal["text"] = "text"
    text: str = ""


class ThinkingContent(_Wire):
    """The model's thinking; `signature` is the gateway's placeholder (no engine here signs its thinking)."""

    type: Literal["thinking"] = "thinking"
    thinking: str = ""
    signature: str = ""


class ToolUseContent(_Wire):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


OutputBlock = TextContent | ThinkingContent | ToolUseContent


class Usage(_Wire):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int | None = Field(default=None, exclude_if=lambda v: v is None)
    """Absent when the engine does not say what it served from cache (LMDeploy; docs/api.md "Cached tokens")."""


class MessageBody(_Wire):
    """A Message: the non-streamed answer, and the stream's `message_start` snapshot."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[OutputBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage


# -- block deltas ---------------------------------------------------------------------------------------
class TextDelta(_Wire):
    type: Literal["text_delta"] = "text_delta"
    text: str


class ThinkingDelta(_Wire):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(_Wire):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class InputJsonDelta(_Wire):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


BlockDelta = TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


# -- stream events --------------------------------------------------------------------------------------
class MessageStart(_Wire):
    type: Literal["message_start"] = "message_start"
    message: MessageBody


class Ping(_Wire):
    type: Literal["ping"] = "ping"


class ContentBlockStart(_Wire):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: OutputBlock


class ContentBlockDelta(_Wire):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: BlockDelta


class ContentBlockStop(_Wire):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class StopDelta(_Wire):
    stop_reason: StopReason
    stop_sequence: str | None


class DeltaUsage(_Wire):
    """message_delta's usage: the output tokens, and the input counts when the engine sent them."""

    output_tokens: int
    input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class MessageDelta(_Wire):
    type: Literal["message_delta"] = "message_delta"
    delta: StopDelta
    usage: DeltaUsage

    def wire(self) -> dict[str, Any]:
        """As Anthropic sends it: the usage without the counts not known (the stop fields null when none)."""
        return {"type": self.type, "delta": self.delta.wire(), "usage": self.usage.model_dump(exclude_none=True)}


class MessageStop(_Wire):
    type: Literal["message_stop"] = "message_stop"


StreamEvent = (
    MessageStart | Ping | ContentBlockStart | ContentBlockDelta | ContentBlockStop | MessageDelta | MessageStop
)
