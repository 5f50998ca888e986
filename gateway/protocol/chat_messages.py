"""Chat messages and their content parts as the chat request takes them (text, images; the rest refused by
name), each able to become the engine's message (`to_engine`). Split from `gateway.protocol.requests`, which
re-exports every name here."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from backends.request import IMAGE_MARKER, EngineMessage, ToolCall


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# Names frontends (Open WebUI, Ollama clients, llama.cpp's web UI) send for parameters we have.


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageUrl(_Strict):
    url: str = Field(min_length=1, description="a data URI, or an http(s) URL the operator allows")
    detail: Literal["auto", "low", "high"] | None = None  # accepted; the models here have one resolution


class ImageUrlPart(_Strict):
    """An image (user messages only): checked and decoded by the gateway (gateway/serving/vision_parts.py)."""

    type: Literal["image_url"]
    image_url: ImageUrl

    @field_validator("image_url", mode="before")
    @classmethod
    def _bare_url(cls, value: Any) -> Any:  # some clients send the URL as a string
        return {"url": value} if isinstance(value, str) else value


class _OtherPart(BaseModel):
    """Any other non-text content part (input_audio, file): recognised only to be refused by name."""

    model_config = ConfigDict(extra="allow", frozen=True)
    type: Literal["input_audio", "file", "refusal"]


ContentPart = Annotated[TextPart | ImageUrlPart | _OtherPart, Field(discriminator="type")]


class _Message(_Body):
    name: str | None = None

    def text(self) -> str:
        content = getattr(self, "content", None)
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(part.text for part in content if isinstance(part, TextPart))

    def to_engine(self) -> EngineMessage:
        role = getattr(self, "role", "user")
        content = self.text_with_images() if role == "user" else self.text()
        return EngineMessage(role="system" if role == "developer" else role, content=content, name=self.name)

    def text_with_images(self) -> str:
        """The text with `IMAGE_MARKER` where each image part was (the engine request's `images` fill them)."""
        content = getattr(self, "content", None)
        if not isinstance(content, list):
            return self.text()
        return "".join(
            part.text if isinstance(part, TextPart) else IMAGE_MARKER
            for part in content
            if isinstance(part, TextPart | ImageUrlPart)
        )

    def image_parts(self) -> list[tuple[int, ImageUrlPart]]:
        """The message's image parts with their index in `content`."""
        content = getattr(self, "content", None)
        if not isinstance(content, list):
            return []
        return [(j, part) for j, part in enumerate(content) if isinstance(part, ImageUrlPart)]


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
    tool_calls: list[ToolCall] | None = None
    function_call: dict[str, Any] | None = None
    reasoning_content: str | None = None  # an earlier turn's thinking (llama.cpp's, LMDeploy's, SGLang's name)
    reasoning: str | None = None  # the same, as vLLM and Ollama name it since 2026

    def to_engine(self) -> EngineMessage:
        """The engine's message; the thinking under either name rides as `reasoning_content`, for the chat
        template to keep or drop (Qwen3 drops it from earlier turns, gpt-oss keeps it across tool calls)."""
        calls = tuple(self.tool_calls) if self.tool_calls else None
        content = self.text() if self.content is not None else None
        thinking = self.reasoning_content or self.reasoning or None
        return EngineMessage(
            role="assistant", content=content, name=self.name, tool_calls=calls, reasoning_content=thinking
        )


class ToolMessage(_Message):
    role: Literal["tool"]
    content: str | list[ContentPart]
    tool_call_id: str = Field(min_length=1)

    def to_engine(self) -> EngineMessage:
        return EngineMessage(role="tool", content=self.text(), tool_call_id=self.tool_call_id)


class FunctionMessage(_Message):
    role: Literal["function"]
    content: str | None = None


Message = Annotated[
    SystemMessage | UserMessage | AssistantMessage | ToolMessage | FunctionMessage, Field(discriminator="role")
]
