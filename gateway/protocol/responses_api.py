"""Request body for /v1/responses (OpenAI's Responses API), validated before it becomes a chat request.

`prompt_cache_key`, `user` and `previous_response_id` name the session (gateway.serving.prompt_prefix).
Hints with no meaning for generation here (`service_tier`, `safety_identifier`,
`stream_options`, `max_tool_calls`, which only counts built-in tool calls) are ignored, as OpenAI ignores
unknown fields. A `namespace` tool is a group of function tools and is served (see `NamespaceTool`); hosted
web search is dropped from the turn, visibly (see `DROPPED_TOOL_TYPES`). `reasoning.effort` controls a
reasoning model's thinking (docs/reasoning.md); reasoning items sent back in `input` give the next assistant
turn its thinking (their text; `encrypted_content` is kept, never read). What no engine can honour (other
built-in tools, background mode, conversations, prompt templates, file/audio inputs and `input_image` by
`file_id`, item references, logprobs) is recognised and named by `unsupported()`, which the route turns into a
400.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator

from backends.request import MaxTokens, Temperature, ToolName, TopLogprobs, TopP, missing_tool
from gateway.protocol.reasoning import Effort
from gateway.protocol.tagged import Body, Refused, type_tag


# -- content parts --------------------------------------------------------------------------------------
class InputText(Body):
    type: Literal["input_text"]
    text: str


class OutputText(Body):
    """Assistant text replayed as input; its annotations and logprobs carry no meaning for generation."""

    type: Literal["output_text"]
    text: str


class RefusalPart(Body):
    type: Literal["refusal"]
    refusal: str


class InputImage(Body):
    """An image: `image_url` a data URI (or an allowed http(s) URL); `file_id` refused (no Files API)."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: Literal["auto", "low", "high"] | None = None


ContentPart = Annotated[
    Annotated[InputText, Tag("input_text")]
    | Annotated[OutputText, Tag("output_text")]
    | Annotated[RefusalPart, Tag("refusal")]
    | Annotated[InputImage, Tag("input_image")]
    | Annotated[Refused, Tag("other")],
    type_tag(frozenset({"input_text", "output_text", "refusal", "input_image"})),
]


def content_text(content: str | list[Any]) -> str:
    """Content flattened to text (refusals included: they are what the assistant said)."""
    if isinstance(content, str):
        return content
    return "".join(p.refusal if isinstance(p, RefusalPart) else getattr(p, "text", "") for p in content)


# -- input items ----------------------------------------------------------------------------------------
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class MessageItem(Body):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class FunctionCallItem(Body):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    namespace: str | None = None  # set when the function is one of a namespace tool's
    id: str | None = None
    status: ItemStatus | None = None

    def qualified_name(self) -> str:
        """The name the model knows the function by (`namespace.name` inside a namespace)."""
        return qualified(self.namespace, self.name)


class FunctionCallOutputItem(Body):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class ReasoningText(Body):
    """A reasoning item's `summary_text` or `reasoning_text` part."""

    type: str
    text: str = ""


class ReasoningItem(Refused):
    """An earlier turn's reasoning (ours, or replayed from another provider's output: then its `summary` and
    `encrypted_content` are all there is); other keys are kept as sent (`extra="allow"`)."""

    type: Literal["reasoning"]
    summary: list[ReasoningText] = []
    content: list[ReasoningText] | None = None

    def text(self) -> str:
        """The thinking as text: its `reasoning_text` parts, else its summary's parts."""
        parts = self.content or self.summary
        return "\n\n".join(part.text for part in parts if part.text)


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")]
    | Annotated[Refused, Tag("other")],
    type_tag(frozenset({"message", "function_call", "function_call_output", "reasoning"}), default="message"),
]


# -- tools, tool choice, text format --------------------------------------------------------------------
class FunctionTool(Body):
    """A function tool in the Responses API's flat shape (no nested `function` object)."""

    type: Literal["function"]
    name: ToolName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


NamespaceMember = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[Refused, Tag("other")],
    type_tag(frozenset({"function"})),
]


class NamespaceTool(Body):
    """Function tools grouped under one name (Codex's multi-agent tools), as OpenAI's `NamespaceToolParam`.

    Not a hosted tool: each member is served as a function tool the model knows as `namespace.name`, and a
    call to it is a `function_call` item with `namespace` and `name` apart, as OpenAI's output items name it.
    """

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    tools: list[NamespaceMember] = Field(min_length=1)


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[NamespaceTool, Tag("namespace")]
    | Annotated[Refused, Tag("other")],
    type_tag(frozenset({"function", "namespace"})),
]

# Hosted web search: a capability no engine here has. Codex offers it on every turn by default, so it is
# dropped (the turn is served without it, the log and the `x-voltgate-dropped-tools` header say so) rather
# than failing a turn whose model may never search; forcing it with `tool_choice` is still a 400.
DROPPED_TOOL_TYPES = frozenset({"web_search", "web_search_2025_08_26", "web_search_preview",
                                "web_search_preview_2025_03_11"})  # fmt: skip


def qualified(namespace: str | None, name: str) -> str:
    """A function's name as the model sees it: `namespace.name` for a namespace's member, else `name`."""
    return f"{namespace}.{name}" if namespace else name


class FunctionToolChoice(Body):
    type: Literal["function"]
    name: str


def _choice_tag(value: Any) -> str:
    if isinstance(value, str):
        return "mode"
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "function" if kind == "function" else "other"


ResponsesToolChoice = Annotated[
    Annotated[Literal["auto", "none", "required"], Tag("mode")]
    | Annotated[FunctionToolChoice, Tag("function")]
    | Annotated[Refused, Tag("other")],
    Discriminator(_choice_tag),
]


class TextFormatText(Body):
    type: Literal["text"]


class TextFormatJsonObject(Body):
    type: Literal["json_object"]


class TextFormatJsonSchema(Body):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True, serialize_by_alias=True)
    type: Literal["json_schema"]
    name: str = Field(min_length=1, max_length=64)
    schema_: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")]


class TextConfig(Body):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ReasoningConfig(Body):
    effort: Effort | None = None
    summary: str | None = None


# -- the request ----------------------------------------------------------------------------------------
class ResponsesRequest(Body):
    """POST /v1/responses. `input_items()` is what a stored response keeps of its request."""

    model: str = Field(min_length=1)
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: ResponsesToolChoice | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    prompt_cache_key: str | None = None  # a session hint (gateway.serving.prompt_prefix)
    store: bool | None = True
    previous_response_id: str | None = Field(default=None, min_length=1)
    stream: bool | None = False
    reasoning: ReasoningConfig | None = None
    # Recognised only to be refused when set (see `unsupported`).
    background: bool | None = None
    conversation: str | dict[str, Any] | None = None
    prompt: dict[str, Any] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    include: list[str] | None = None
    top_logprobs: TopLogprobs | None = None
    context_management: list[Any] | None = None
    moderation: dict[str, Any] | None = None

    @field_validator("metadata")
    @classmethod
    def _metadata_limits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        if metadata is None:
            return None
        if len(metadata) > 16:
            raise ValueError("at most 16 metadata pairs")
        for key, value in metadata.items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return metadata

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def stores(self) -> bool:
        return self.store is not False

    def items(self) -> list[Any]:
        """The input as items: a string is one user message."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)

    def input_items(self) -> list[dict[str, Any]]:
        """The input items as JSON, as a stored response keeps them for later `previous_response_id` turns."""
        return [item.model_dump(mode="json", exclude_none=True, by_alias=True) for item in self.items()]

    def function_tools(self) -> list[FunctionTool]:
        """Top-level function tools (not those inside a namespace)."""
        return [tool for tool in self.tools or () if isinstance(tool, FunctionTool)]

    def served_tools(self) -> list[FunctionTool | NamespaceTool]:
        """The tools the model is given, as the client sent them (dropped and refused ones left out)."""
        return [tool for tool in self.tools or () if isinstance(tool, FunctionTool | NamespaceTool)]

    def callable_functions(self) -> dict[str, tuple[str | None, FunctionTool]]:
        """Every function the model may call, by the name it knows it by: (namespace or None, the tool)."""
        functions: dict[str, tuple[str | None, FunctionTool]] = {}
        for tool in self.served_tools():
            if isinstance(tool, FunctionTool):
                functions[tool.name] = (None, tool)
                continue
            for member in tool.tools:
                if isinstance(member, FunctionTool):
                    functions[qualified(tool.name, member.name)] = (tool.name, member)
        return functions

    def dropped_tools(self) -> list[str]:
        """The types of the offered tools that are left out of the turn (see `DROPPED_TOOL_TYPES`)."""
        return [tool.type for tool in self.tools or () if isinstance(tool, Refused) and tool.type in DROPPED_TOOL_TYPES]

    def unsupported(self) -> list[tuple[str, str]]:
        """(param, reason) for each requested feature no engine here can honour."""
        return self._unsupported_options() + self._unsupported_tools() + self._unsupported_input()

    def _unsupported_options(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if self.background:
            problems.append(("background", "background mode is not supported"))
        if self.conversation is not None:
            problems.append(("conversation", "conversations are not supported; use previous_response_id"))
        if self.prompt is not None:
            problems.append(("prompt", "prompt templates are not supported"))
        if self.truncation == "auto":
            problems.append(("truncation", "truncation 'auto' is not supported; input that does not fit is a 400"))
        if self.include and "message.output_text.logprobs" in self.include:
            problems.append(("include", "logprobs are not supported yet"))
        if self.top_logprobs:
            problems.append(("top_logprobs", "logprobs are not supported yet"))
        if self.context_management:
            problems.append(("context_management", "context management is not supported"))
        if self.moderation is not None:
            problems.append(("moderation", "moderation is not supported"))
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            problems.append(("text.verbosity", "verbosity other than 'medium' is not supported"))
        return problems

    def _unsupported_tools(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        seen: set[str] = set()
        for i, tool in enumerate(self.tools or ()):
            if isinstance(tool, Refused) and tool.type not in DROPPED_TOOL_TYPES:
                problems.append((f"tools[{i}].type", f"built-in tool {tool.type!r} is not supported"))
            members = tool.tools if isinstance(tool, NamespaceTool) else [tool]
            for j, member in enumerate(members):
                where = f"tools[{i}].tools[{j}]" if isinstance(tool, NamespaceTool) else f"tools[{i}]"
                if isinstance(tool, NamespaceTool) and isinstance(member, Refused):
                    problems.append((f"{where}.type", f"{member.type!r} tools in a namespace are not supported"))
                if not isinstance(member, FunctionTool):
                    continue
                name = qualified(tool.name, member.name) if isinstance(tool, NamespaceTool) else member.name
                if name in seen:
                    problems.append((f"{where}.name", f"more than one function is named {name!r}"))
                seen.add(name)
        choice = self.tool_choice
        names = set(self.callable_functions())
        if isinstance(choice, Refused):
            problems.append(("tool_choice", f"tool_choice of type {choice.type!r} is not supported"))
        elif isinstance(choice, FunctionToolChoice) and (problem := missing_tool(choice.name, names)) is not None:
            problems.append(("tool_choice", problem))
        elif choice == "required" and not names:
            problems.append(("tool_choice", "tool_choice 'required' needs at least one function tool"))
        return problems

    def _unsupported_input(self) -> list[tuple[str, str]]:
        problems: list[tuple[str, str]] = []
        if isinstance(self.input, str):
            return problems
        for i, item in enumerate(self.input):
            if type(item) is Refused:
                reason = (
                    "item references are not supported; send the item itself or use previous_response_id"
                    if item.type == "item_reference"
                    else f"input items of type {item.type!r} are not supported"
                )
                problems.append((f"input[{i}].type", reason))
            parts = item.content if isinstance(item, MessageItem) else getattr(item, "output", None)
            field = "content" if isinstance(item, MessageItem) else "output"
            for j, part in enumerate(parts if isinstance(parts, list) else ()):
                if isinstance(part, Refused):
                    problems.append((f"input[{i}].{field}[{j}].type", f"{part.type!r} input is not supported"))
                problems += _image_problems(f"input[{i}].{field}[{j}]", part, item)
        return problems


def _image_problems(where: str, part: Any, item: Any) -> list[tuple[str, str]]:
    if not isinstance(part, InputImage):
        return []
    if not isinstance(item, MessageItem) or item.role != "user":
        return [(f"{where}.type", "images are accepted in user messages only")]
    if part.file_id is not None:
        return [(f"{where}.file_id", "file_id is not supported (no Files API): send image_url as a data URI")]
    if not part.image_url:
        return [(f"{where}.image_url", "an input_image needs image_url")]
    return []
