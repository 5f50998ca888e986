"""Anthropic's Messages API as a translation over the one chat path: request → chat, chat → Message.

Content blocks map onto chat messages in order: an assistant turn's `tool_use` blocks become its
`tool_calls` (arguments as JSON text), each `tool_result` block of a user turn becomes a `tool` message
with its `tool_call_id`. Tool-use ids are the chat tool-call ids in both directions. Errors render in
Anthropic's envelope (`anthropic_error`).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any, Literal

from backends.request import (
    EngineRequest,
    FunctionCall,
    FunctionDefinition,
    FunctionName,
    JsonSchemaFormat,
    NamedToolChoice,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
)
from gateway.errors import ERROR_TYPES as ERROR_TYPES  # re-exported: Anthropic's envelope lives with the others
from gateway.errors import ErrorCode, GatewayError
from gateway.errors import anthropic_error as anthropic_error
from gateway.errors import anthropic_error_body as anthropic_error_body
from gateway.protocol.anthropic import (
    CountTokensRequest,
    CustomTool,
    ImageBlock,
    InputMessage,
    MessagesRequest,
    RedactedThinkingBlock,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from gateway.protocol.anthropic import ToolChoice as AnthropicToolChoice
from gateway.protocol.anthropic_events import (
    MessageBody,
    OutputBlock,
    StopReason,
    TextContent,
    ThinkingContent,
    ToolUseContent,
    Usage,
)
from gateway.protocol.chat_messages import (
    AssistantMessage,
    ContentPart,
    ImageUrl,
    ImageUrlPart,
    Message,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.reasoning import Effort
from gateway.protocol.requests import ChatCompletionRequest, StreamOptions
from gateway.protocol.responses import ChatChoice, ChatCompletion, CompletionUsage
from gateway.protocol.tagged import Refused
from gateway.translate.params import MESSAGES, located, translated

# -- request ----------------------------------------------------------------------------------------------
Block = TextBlock | ToolUseBlock | ToolResultBlock | ImageBlock | ThinkingBlock | RedactedThinkingBlock | Refused
SIGNATURE = "voltgate-unsigned"
"""The placeholder `signature` of our thinking blocks: SDKs and Claude Code keep one and send it back; no
engine here signs its thinking, and a thinking block's signature is not checked when it comes back."""
ToolMode = Literal["auto", "none", "required"]


def _result_content(block: ToolResultBlock) -> str:
    """A tool result's text. Chat has no error flag on tool messages, so a failed call says so in words."""
    text = block.text()
    return f"Error: {text}" if block.is_error else text


def _user(blocks: list[Block]) -> list[Message]:
    """A user turn: its text blocks as user messages, each tool_result as a `tool` message, in order."""
    out: list[Message] = []
    parts: list[ContentPart] = []
    for block in blocks:
        if isinstance(block, TextBlock):
            parts.append(TextPart(type="text", text=block.text))
        elif isinstance(block, ImageBlock):
            parts.append(ImageUrlPart(type="image_url", image_url=ImageUrl(url=block.url())))
        elif isinstance(block, ToolResultBlock):
            if parts:
                out.append(UserMessage(role="user", content=parts))
                parts = []
            out.append(ToolMessage(role="tool", tool_call_id=block.tool_use_id, content=_result_content(block)))
    if parts:
        out.append(UserMessage(role="user", content=parts))
    return out


def client_image_param(
    param: str | None, chat: ChatCompletionRequest, req: MessagesRequest | CountTokensRequest
) -> str | None:
    """The client's path (`messages.2.content.1.source`) of the image that the chat path's `param` names
    (`messages[3].content[0].image_url...`), or None when `param` names no image part. Images keep their
    order through the translation (only user turns hold them), so the n-th chat image part is the n-th
    image block the client sent, though the message indices differ."""
    chat_images = [
        f"messages[{i}].content[{j}].image_url" for i, m in enumerate(chat.messages) for j, _ in m.image_parts()
    ]
    ordinal = next((n for n, p in enumerate(chat_images) if param is not None and param.startswith(p)), None)
    client_images = [
        f"messages.{i}.content.{j}.source"
        for i, turn in enumerate(req.messages) if isinstance(turn.content, list)
        for j, block in enumerate(turn.content) if isinstance(block, ImageBlock)
    ]  # fmt: skip
    return client_images[ordinal] if ordinal is not None and ordinal < len(client_images) else None


def _assistant(blocks: list[Block]) -> AssistantMessage:
    text: list[ContentPart] = [TextPart(type="text", text=b.text) for b in blocks if isinstance(b, TextBlock)]
    calls = [
        ToolCall(
            id=b.id,
            type="function",
            function=FunctionCall(name=b.name, arguments=json.dumps(b.input, ensure_ascii=False)),
        )
        for b in blocks
        if isinstance(b, ToolUseBlock)
    ]
    thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))  # redacted: left out
    return AssistantMessage(
        role="assistant", content=text or None, tool_calls=calls or None, reasoning_content=thinking or None
    )


def _messages(req: CountTokensRequest) -> list[Message]:
    messages: list[Message] = []
    system = req.system_text()
    if system:
        messages.append(SystemMessage(role="system", content=system))
    _check_system_turns(req.messages)
    _check_tool_ids(req.messages)
    for message in req.messages:
        messages += _turn(message)
    return messages


def _check_system_turns(turns: list[InputMessage]) -> None:
    """Anthropic's placement of mid-conversation system messages, each break a 400 naming the message: never
    first, never two in a row, right after a user turn, and either last or followed by an assistant turn."""
    for i, turn in enumerate(turns):
        if turn.role != "system":
            continue
        before = turns[i - 1].role if i else None
        after = turns[i + 1].role if i + 1 < len(turns) else None
        if before is None:
            why = "a system message cannot be the first message; put it in the top-level `system`"
        elif before == "system":
            why = "consecutive system messages are not allowed; merge them into one"
        elif before != "user":
            why = "a mid-conversation system message must follow a user message"
        elif after not in (None, "assistant", "system"):
            why = "a mid-conversation system message must be the last message or be followed by an assistant message"
        else:
            continue
        raise GatewayError(ErrorCode.INVALID_REQUEST, why, param=f"messages.{i}.role")


def _check_tool_ids(turns: list[InputMessage]) -> None:
    """As Anthropic answers them: a tool_result for no earlier tool_use, or a tool_use never answered, is a 400."""
    pending: dict[str, str] = {}  # tool_use id → where it was
    for i, turn in enumerate(turns):
        for j, block in enumerate(turn.content if isinstance(turn.content, list) else ()):
            where = f"messages.{i}.content.{j}"
            if isinstance(block, ToolUseBlock):
                pending[block.id] = where
            elif isinstance(block, ToolResultBlock) and pending.pop(block.tool_use_id, None) is None:
                message = f"tool_result block for {block.tool_use_id!r}, which no earlier tool_use block has"
                raise GatewayError(ErrorCode.INVALID_REQUEST, message, param=f"{where}.tool_use_id")
    if pending:
        tool_use_id, where = next(iter(pending.items()))
        message = f"tool_use block {tool_use_id!r} has no tool_result block after it"
        raise GatewayError(ErrorCode.INVALID_REQUEST, message, param=f"{where}.id")


def _turn(message: InputMessage) -> list[Message]:
    content = message.content
    if message.role == "system":  # a mid-conversation system message stays where it is
        text = content if isinstance(content, str) else "\n".join(b.text for b in content if isinstance(b, TextBlock))
        return [SystemMessage(role="system", content=text)]
    if isinstance(content, str):
        if message.role == "assistant":
            return [AssistantMessage(role="assistant", content=content)]
        return [UserMessage(role="user", content=content)]
    if message.role == "assistant":
        return [_assistant(content)]
    return _user(content)


def _function(tool: CustomTool) -> FunctionDefinition:
    return FunctionDefinition(
        name=tool.name, description=tool.description, parameters=tool.input_schema, strict=tool.strict
    )


def _tools(req: CountTokensRequest) -> list[Tool] | None:
    """The chat tools: the client tools the model sees (`prompt_tools`: deferred ones wait for a search)."""
    prompt = req.prompt_tools()
    tools = [
        Tool(type="function", function=located(("tools", i, "function"), partial(_function, tool)))
        for i, tool in enumerate(req.custom_tools())
        if tool in prompt
    ]
    return tools or None


_MODES: dict[str, ToolMode] = {"auto": "auto", "any": "required", "none": "none"}
_EFFORTS: dict[str, Effort] = {"low": "low", "medium": "medium", "high": "high", "xhigh": "xhigh", "max": "xhigh"}


def _reasoning(req: MessagesRequest) -> tuple[Effort | None, int | None]:
    """(reasoning_effort, thinking_budget_tokens) for the chat request: `disabled` is effort "none";
    `enabled` gives its budget; `output_config.effort` the effort (max is the highest, xhigh); neither (no
    `thinking`, or `adaptive`) leaves the model's default."""
    thinking = req.thinking
    if thinking is not None and thinking.type == "disabled":
        return "none", None
    effort = req.output_config.effort if req.output_config is not None else None
    budget = thinking.budget_tokens if thinking is not None and thinking.type == "enabled" else None
    return (_EFFORTS[effort] if effort is not None else None), budget


def _tool_choice(choice: AnthropicToolChoice | None) -> ToolChoice | None:
    """any → "required", tool → named (`unsupported()` has checked that the name is offered), none → "none"."""
    if choice is None:
        return None
    if choice.type == "tool":
        assert choice.name is not None, "a named tool_choice without a name is refused by unsupported()"
        return NamedToolChoice(type="function", function=FunctionName(name=choice.name))
    return _MODES[choice.type]


class MessagesChatRequest(ChatCompletionRequest):
    """The chat request a Messages request becomes (`to_chat`). Streamed, it asks the engine to put the
    prompt's usage in its first chunk (`stream_options.include_prompt_usage`), so that message_start reports
    `input_tokens` and `cache_read_input_tokens` as Anthropic's does."""

    def to_engine(self, target: EngineTarget) -> EngineRequest:
        return super().to_engine(target).asking_prompt_usage()


def to_chat(req: MessagesRequest | CountTokensRequest) -> MessagesChatRequest:
    """The chat-completions request for `req`, built typed; for `CountTokensRequest` its prompt part with
    `max_tokens` 1 (count_tokens reads the prompt's usage). Raises a 400 `GatewayError` naming the client's
    parameter.

    Mapping: system → a leading system message (text blocks joined by newlines), a mid-conversation system
    message → a system message in its place; tool_result with is_error → a tool message whose content starts
    "Error: "; tool_choice any → "required", tool → named, none → "none", disable_parallel_tool_use →
    parallel_tool_calls false; stop_sequences → stop; top_k is the gateway's top_k extension;
    metadata.user_id → user; output_config.format → response_format json_schema.
    """
    messages = _messages(req)  # its refusals name the client's own message paths: before the renaming
    return translated(MESSAGES, lambda: _chat(req, messages))


def _chat(req: MessagesRequest | CountTokensRequest, messages: list[Message]) -> MessagesChatRequest:
    tools = _tools(req)
    choice = req.tool_choice if tools else None
    parallel = False if choice is not None and choice.disable_parallel_tool_use else None
    if not isinstance(req, MessagesRequest):
        return MessagesChatRequest(
            model=req.model, messages=messages, tools=tools, tool_choice=_tool_choice(choice),
            parallel_tool_calls=parallel, max_tokens=1,
        )  # fmt: skip
    fmt = req.output_config.format if req.output_config is not None else None
    effort, budget = _reasoning(req)
    return MessagesChatRequest(
        model=req.model,
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(choice),
        parallel_tool_calls=parallel,
        max_tokens=req.max_tokens,
        stop=list(req.stop_sequences) if req.stop_sequences else None,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        user=req.metadata.user_id if req.metadata is not None else None,
        response_format=(
            ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name="response", schema_=fmt.schema_))
            if fmt is not None
            else None
        ),
        stream=req.streaming,
        stream_options=StreamOptions(include_usage=True) if req.streaming else None,
        reasoning_effort=effort,
        thinking_budget_tokens=budget,
    )


# -- response ---------------------------------------------------------------------------------------------
def _is_object(arguments: str) -> bool:
    try:
        return not arguments.strip() or isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def tool_input(name: str, arguments: str) -> dict[str, Any]:
    """A tool call's JSON arguments as Anthropic's `input` object; empty arguments are `{}`.

    Raises a 502 `GatewayError` (upstream_error) when the model's arguments are not a JSON object, which
    Anthropic's `tool_use.input` must be.
    """
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise GatewayError(ErrorCode.UPSTREAM_ERROR, f"the model's arguments for tool {name!r} are not a JSON object")
    return value


def stop_reason(
    finish_reason: str | None, *, tool_calls: bool, matched: str | int | None, stop_sequences: list[str] | None
) -> tuple[StopReason, str | None]:
    """Anthropic's (stop_reason, stop_sequence) for a chat finish.

    The chat path reports a matched stop string and a natural end alike as "stop", and engines strip the
    matched string from the text, so the two cannot be told apart from the text. `stop_sequence` is
    reported when the upstream names the string it matched (`matched`: `stop_reason`, as vLLM and our
    llama.cpp worker send it, or `matched_stop`, as SGLang does; `ChatChoice.matched`, `ChunkChoice.matched`)
    and it is one of the request's `stop_sequences`; otherwise "stop" is `end_turn`, which under-reports a
    stop-sequence match on an engine that does not name the string.
    """
    if finish_reason == "length":
        return "max_tokens", None
    if tool_calls or finish_reason in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish_reason == "content_filter":
        return "refusal", None
    if isinstance(matched, str) and matched in (stop_sequences or ()):
        return "stop_sequence", matched
    return "end_turn", None


def usage(chat_usage: CompletionUsage | None) -> dict[str, int]:
    """Chat usage in Anthropic's terms: prompt tokens served from the engine's prefix cache are
    `cache_read_input_tokens`, the rest `input_tokens` (their sum is the prompt, as Anthropic counts it;
    nothing is written to a cache on request, so `cache_creation_input_tokens` is 0). An engine that does not
    say what it served from cache (LMDeploy) gets no `cache_read_input_tokens` (optional in Anthropic's Usage)
    rather than a 0 that was never measured."""
    if chat_usage is None:
        return {"input_tokens": 0, "output_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}
    prompt, said = chat_usage.prompt_tokens, chat_usage.cached_tokens
    cached = 0 if said is None else min(prompt, said)
    counted = {"input_tokens": prompt - cached, "output_tokens": chat_usage.completion_tokens,
               "cache_creation_input_tokens": 0}  # fmt: skip
    return counted if said is None else {**counted, "cache_read_input_tokens": cached}


def prompt_tokens(chat_usage: CompletionUsage | None) -> int:
    """The whole prompt's tokens (count_tokens' answer), cached or not."""
    return chat_usage.prompt_tokens if chat_usage is not None else 0


def _content(choice: ChatChoice) -> tuple[list[OutputBlock], int]:
    """The Message's content blocks for a chat choice (its thinking, its text, its refusal, one tool_use block
    per tool call) and how many tool_use blocks there are."""
    message = choice.message
    content: list[OutputBlock] = []
    if message.reasoning_content:
        content.append(ThinkingContent(thinking=message.reasoning_content, signature=SIGNATURE))
    if message.content:
        content.append(TextContent(text=message.content))
    if message.refusal:
        content.append(TextContent(text=message.refusal))
    cut = choice.finish_reason == "length"
    used = 0
    for call in message.tool_calls or ():
        name, arguments = call.function.name, call.function.arguments
        if cut and not _is_object(arguments):
            # max_tokens cut the call's arguments short (TurboMind sends what it had): Anthropic's answer is
            # stop_reason max_tokens, so the text the model wrote is kept as text, never a 502.
            content.append(TextContent(text=arguments))
            continue
        content.append(ToolUseContent(id=call.id, name=name, input=tool_input(name, arguments)))
        used += 1
    return content, used


def to_message(chat: ChatCompletion, req: MessagesRequest, *, message_id: str) -> dict[str, Any]:
    """The Message for the typed non-streamed chat answer: a text block for its first choice's text, then one
    tool_use block per tool call (input = the parsed arguments); `stop_sequence` is the stop string the
    upstream says it matched. The model echoed is the requested one."""
    choice = chat.choice
    content, used = _content(choice)
    reason, sequence = stop_reason(
        choice.finish_reason, tool_calls=bool(used), matched=choice.matched, stop_sequences=req.stop_sequences
    )
    if choice.message.refusal and reason == "end_turn":
        reason = "refusal"
    message = MessageBody(
        id=message_id, model=req.model, content=content, stop_reason=reason, stop_sequence=sequence,
        usage=Usage(**usage(chat.usage)),
    )  # fmt: skip
    return message.wire()
