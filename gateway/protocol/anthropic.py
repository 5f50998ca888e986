"""Request bodies for /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API).

Validated before translation to the gateway's chat request. Hints with no meaning here (`cache_control`
on blocks, `service_tier`, `speed`) are ignored. `thinking` (`enabled` with its `budget_tokens`, `disabled`,
`adaptive`) and `output_config.effort` control a reasoning model's thinking (docs/reasoning.md); `thinking`
blocks in assistant turns are an earlier turn's thinking, `redacted_thinking` blocks (Anthropic's encrypted
thinking, which no model here can read) are accepted and left out. `image` blocks in user turns become
chat image parts (docs/vision.md). Documents, server tools (web search, code execution, ...), MCP servers
and containers are recognised and named by `unsupported()`, which the route turns into a 400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag

from backends.request import MaxTokens, StopString, ToolName, TopK, TopP, missing_tool
from gateway.protocol.tagged import Body, Refused, type_tag


# -- content blocks -------------------------------------------------------------------------------------
class TextBlock(Body):
    type: Literal["text"]
    text: str


class Base64Source(Body):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(Body):
    type: Literal["url"]
    url: str = Field(min_length=1)


class ImageBlock(Body):
    """An image (user turns): base64, or a URL fetched by the gateway only where the operator allows it."""

    type: Literal["image"]
    source: Annotated[
        Annotated[Base64Source, Tag("base64")] | Annotated[UrlSource, Tag("url")] | Annotated[Refused, Tag("other")],
        type_tag(frozenset({"base64", "url"})),
    ]

    def url(self) -> str:
        """The image as a chat `image_url`: a data URI for base64 (its media type checked against the bytes)."""
        source = self.source
        if isinstance(source, UrlSource):
            return source.url
        assert isinstance(source, Base64Source), "refused by unsupported()"
        return f"data:{source.media_type};base64,{source.data}"


class ToolReferenceBlock(Body):
    """A tool search's result (in a tool_result): it loads the deferred tool `tool_name` into the prompt."""

    type: Literal["tool_reference"]
    tool_name: str = Field(min_length=1)


class ThinkingBlock(Body):
    """An earlier assistant turn's thinking; its `signature` (ours is a placeholder) is not checked."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Body):
    """Thinking Anthropic encrypted: opaque to any model here, so it is left out of the prompt."""

    type: Literal["redacted_thinking"]
    data: str = ""


ResultContent = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolReferenceBlock, Tag("tool_reference")]
    | Annotated[Refused, Tag("other")],
    type_tag(frozenset({"text", "tool_reference"})),
]


class ToolUseBlock(Body):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]


class ToolResultBlock(Body):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[ResultContent] | None = None
    is_error: bool | None = None

    def text(self) -> str:
        """The result as the model reads it: text blocks, and a line per tool a `tool_reference` loaded."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "\n".join(
            block.text if isinstance(block, TextBlock) else f"Tool loaded: {block.tool_name}"
            for block in self.content
            if isinstance(block, TextBlock | ToolReferenceBlock)
        )


ContentBlock = Annotated[
    Annotated[TextBlock, Tag("text")]
    | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[ImageBlock, Tag("image")]
    | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[RedactedThinkingBlock, Tag("redacted_thinking")]
    | Annotated[Refused, Tag("other")],
    type_tag(frozenset({"text", "tool_use", "tool_result", "image", "thinking", "redacted_thinking"})),
]


class InputMessage(Body):
    """A turn. `system` is a mid-conversation system message (Claude Code sends them): text only, placed as
    Anthropic places them (the translation checks where)."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlock]


# -- tools, tool choice, thinking, output format --------------------------------------------------------
class CustomTool(Body):
    """A client tool; `type` is absent or "custom". Server tools have dated types and are refused.
    `defer_loading`: left out of the prompt until a `tool_reference` block (a tool search's result) names it."""

    type: Literal["custom"] | None = None
    name: ToolName
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None
    defer_loading: bool | None = None


def _tool_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "custom" if kind in (None, "custom") else "other"


MessagesTool = Annotated[
    Annotated[CustomTool, Tag("custom")] | Annotated[Refused, Tag("other")], Discriminator(_tool_tag)
]


class ToolChoice(Body):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


MIN_THINKING_BUDGET = 1024
"""Anthropic's smallest `thinking.budget_tokens`."""


class Thinking(Body):
    """`enabled` with a `budget_tokens` (at least 1,024 and under `max_tokens`, as Anthropic checks),
    `disabled`, or `adaptive` (the model decides; its effort from `output_config.effort`)."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=MIN_THINKING_BUDGET)


class JsonOutputFormat(Body):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, serialize_by_alias=True)
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(Body):
    format: JsonOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None


class Metadata(Body):
    user_id: str | None = None


# -- requests -------------------------------------------------------------------------------------------
class CountTokensRequest(Body):
    """POST /v1/messages/count_tokens: the prompt part of a Messages request."""

    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[MessagesTool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    mcp_servers: list[Any] | None = None

    def system_text(self) -> str | None:
        if self.system is None or isinstance(self.system, str):
            return self.system or None
        return "\n".join(block.text for block in self.system) or None

    def custom_tools(self) -> list[CustomTool]:
        return [tool for tool in self.tools or () if isinstance(tool, CustomTool)]

    def prompt_tools(self) -> list[CustomTool]:
        """The client tools the model sees: all but the `defer_loading` ones that no `tool_reference` block in
        the conversation has loaded yet (as Anthropic's tool search keeps deferred tools out of the context)."""
        loaded = self.referenced_tools()
        return [tool for tool in self.custom_tools() if not tool.defer_loading or tool.name in loaded]

    def referenced_tools(self) -> set[str]:
        """The tool names that `tool_reference` blocks in tool results have loaded."""
        return {
            part.tool_name
            for message in self.messages
            if isinstance(message.content, list)
            for block in message.content
            if isinstance(block, ToolResultBlock) and isinstance(block.content, list)
            for part in block.content
            if isinstance(part, ToolReferenceBlock)
        }

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, reason) for each requested feature no engine here can honour."""
        problems: list[tuple[str, str]] = []
        if self.thinking is not None and self.thinking.type == "enabled" and self.thinking.budget_tokens is None:
            problems.append(("thinking.budget_tokens", "thinking.budget_tokens: Field required"))
        if self.mcp_servers:
            problems.append(("mcp_servers", "MCP servers are not supported"))
        for i, tool in enumerate(self.tools or ()):
            if isinstance(tool, Refused):
                problems.append((f"tools.{i}.type", f"server tool {tool.type!r} is not supported"))
        problems += self._unsupported_choice()
        for i, message in enumerate(self.messages):
            for j, block in enumerate(message.content if isinstance(message.content, list) else ()):
                problems += _block_problems(f"messages.{i}.content.{j}", block, message.role)
        return problems

    def _unsupported_choice(self) -> list[tuple[str, str]]:
        choice = self.tool_choice
        names = {tool.name for tool in self.prompt_tools()}
        if choice is None:
            return []
        problem = missing_tool(choice.name, names) if choice.type == "tool" else None
        if problem is not None:
            return [("tool_choice.name", problem)]
        if choice.type == "any" and not names:
            return [("tool_choice", "tool_choice 'any' needs at least one tool")]
        return []


def _block_problems(where: str, block: Any, role: str) -> list[tuple[str, str]]:
    if role == "system" and not isinstance(block, TextBlock):
        return [(f"{where}.type", "system messages hold text blocks only")]
    if isinstance(block, Refused):
        return [(f"{where}.type", f"content blocks of type {block.type!r} are not supported")]
    if isinstance(block, ImageBlock) and role != "user":
        return [(f"{where}.type", "image blocks belong to user messages")]
    if isinstance(block, ImageBlock) and isinstance(block.source, Refused):
        return [(f"{where}.source.type", f"image sources of type {block.source.type!r} are not supported: "
                 "send base64 or url")]  # fmt: skip
    if isinstance(block, ToolUseBlock | ThinkingBlock | RedactedThinkingBlock) and role != "assistant":
        return [(f"{where}.type", f"{block.type} blocks belong to assistant messages")]
    if isinstance(block, ToolResultBlock):
        if role != "user":
            return [(f"{where}.type", "tool_result blocks belong to user messages")]
        if isinstance(block.content, list):
            for k, part in enumerate(block.content):
                if isinstance(part, Refused):
                    return [(f"{where}.content.{k}.type", f"tool results of type {part.type!r} are not supported")]
    return []


class MessagesRequest(CountTokensRequest):
    """POST /v1/messages. `max_tokens` is required, as in Anthropic's API."""

    max_tokens: MaxTokens
    stop_sequences: list[StopString] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: TopP | None = None
    top_k: TopK | None = None
    metadata: Metadata | None = None
    stream: bool | None = False
    output_config: OutputConfig | None = None
    container: str | dict[str, Any] | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.container is not None:
            problems.append(("container", "containers are not supported"))
        budget = self.thinking.budget_tokens if self.thinking is not None else None
        if budget is not None and budget >= self.max_tokens:
            problems.append(("max_tokens", "`max_tokens` must be greater than `thinking.budget_tokens`"))
        return problems
