"""OpenAI's Responses API as a translation over the one chat path: request → chat, chat → Response.

    ResponsesRequest + history ──to_chat──▶ chat request ──chat path──▶ chat.completion ──to_response──▶ Response
                                                                    └──▶ chunks ──ResponsesStream──▶ events

`history` is the flat item list of the `previous_response_id` chain (`ResponseStore.history`): every earlier
turn's input items and output items, oldest first, so a follow-up turn replays function calls and their
outputs by `call_id` exactly as the model produced them. Chat tool-call ids are the Responses `call_id`s
in both directions; each function_call item also has its own `fc_…` item id.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

from pydantic import TypeAdapter

from backends.request import (
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
from gateway.errors import ErrorCode, GatewayError
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
from gateway.protocol.requests import ChatCompletionRequest, StreamOptions
from gateway.protocol.responses import ChatCompletion, ChatCompletionMessage, CompletionUsage
from gateway.protocol.responses_api import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    FunctionToolChoice,
    InputImage,
    InputItem,
    InputText,
    ItemStatus,
    MessageItem,
    OutputText,
    ReasoningItem,
    RefusalPart,
    ResponsesRequest,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    content_text,
)
from gateway.protocol.responses_events import (
    OutputFunctionCall,
    OutputItem,
    OutputMessage,
    OutputReasoning,
    OutputRefusal,
    OutputTextPart,
    SummaryTextPart,
)
from gateway.protocol.tagged import Refused
from gateway.translate.ids import new_id
from gateway.translate.params import RESPONSES, located, translated

_ITEMS: TypeAdapter[list[InputItem]] = TypeAdapter(list[InputItem])

# The Response's `error.code` is an enum: a gateway code maps onto its nearest member (else server_error), and
# the stream's `error` event carries the same code, so a client reads one reason whichever it looks at.
_RESPONSE_ERROR_CODES = {
    "rate_limit_exceeded": "rate_limit_exceeded",
    "queue_full": "rate_limit_exceeded",
    "context_length_exceeded": "invalid_prompt",
    "invalid_prompt": "invalid_prompt",
}


# -- request ----------------------------------------------------------------------------------------------
Part = InputText | OutputText | RefusalPart | InputImage | Refused


def _parts(content: str | list[Part]) -> str | list[ContentPart]:
    if isinstance(content, str):
        return content
    return [_chat_part(part) for part in content]


def _chat_part(part: Part) -> ContentPart:
    if isinstance(part, InputImage):  # checked by `unsupported()`: a user message's, with image_url
        assert part.image_url is not None, "an input_image without image_url is refused by unsupported()"
        return ImageUrlPart(type="image_url", image_url=ImageUrl(url=part.image_url, detail=part.detail or "auto"))
    return TextPart(type="text", text=content_text([part]))


def _message(item: MessageItem) -> Message:
    content = _parts(item.content)
    if item.role == "user":
        return UserMessage(role="user", content=content)
    if item.role == "assistant":
        return AssistantMessage(role="assistant", content=content)
    return SystemMessage(role=item.role, content=content)


def _call(item: FunctionCallItem) -> ToolCall:
    return ToolCall(
        id=item.call_id, type="function", function=FunctionCall(name=item.qualified_name(), arguments=item.arguments)
    )


def _add_call(messages: list[Message], call: ToolCall) -> None:
    """A function call joins the assistant message before it, else opens one."""
    last = messages[-1] if messages else None
    if isinstance(last, AssistantMessage):
        messages[-1] = last.model_copy(update={"tool_calls": [*(last.tool_calls or ()), call]})
    else:
        messages.append(AssistantMessage(role="assistant", content=None, tool_calls=[call]))


def _thinking_only(message: Message) -> bool:
    return isinstance(message, AssistantMessage) and message.content is None and not message.tool_calls


def _add_reasoning(messages: list[Message], text: str) -> None:
    """A reasoning item opens the assistant turn that its message or function calls then join."""
    if text:
        messages.append(AssistantMessage(role="assistant", content=None, reasoning_content=text))


def _add_message(messages: list[Message], message: Message) -> None:
    """A message; an assistant one joins the thinking before it (`_add_reasoning`)."""
    last = messages[-1] if messages else None
    if isinstance(message, AssistantMessage) and isinstance(last, AssistantMessage) and _thinking_only(last):
        messages[-1] = last.model_copy(update={"content": message.content})
    else:
        messages.append(message)


def _messages(items: list[InputItem], *, first_request_index: int) -> list[Message]:
    """Chat messages for Responses items; consecutive assistant text and function calls form one message.

    As OpenAI answers them, a function_call_output whose call_id no earlier function_call produced, and a
    function_call left without its output, are 400s; an output is named by its index in the request's own
    `input` (items before `first_request_index` are history).
    """
    messages: list[Message] = []
    call_ids: dict[str, bool] = {}  # call_id → answered
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            _add_message(messages, _message(item))
        elif isinstance(item, FunctionCallItem):
            call_ids[item.call_id] = False
            _add_call(messages, _call(item))
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in call_ids:
                where = f"input[{i - first_request_index}]" if i >= first_request_index else "previous_response_id"
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST,
                    f"No tool call found for function call output with call_id {item.call_id}.",
                    param=where,
                )
            call_ids[item.call_id] = True
            messages.append(ToolMessage(role="tool", tool_call_id=item.call_id, content=_parts(item.output)))
        elif isinstance(item, ReasoningItem):
            _add_reasoning(messages, item.text())
        else:
            raise GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, f"input items of type {item.type!r} are not supported")
    messages = [m for m in messages if not _thinking_only(m)]  # reasoning with no turn after it: nothing to say
    unanswered = [call_id for call_id, answered in call_ids.items() if not answered]
    if unanswered:
        message = f"No tool output found for function call {unanswered[0]}."
        raise GatewayError(ErrorCode.INVALID_REQUEST, message, param="input")
    return messages


def _tool_choice(req: ResponsesRequest) -> ToolChoice | None:
    choice = req.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return NamedToolChoice(type="function", function=FunctionName(name=choice.name))
    return choice if isinstance(choice, str) else None


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        return ResponseFormat(type="json_object")
    if isinstance(fmt, TextFormatJsonSchema):
        schema = JsonSchemaFormat(name=fmt.name, schema_=fmt.schema_, strict=fmt.strict, description=fmt.description)
        return ResponseFormat(type="json_schema", json_schema=schema)
    return None


def _tools(req: ResponsesRequest) -> list[Tool] | None:
    """The callable functions as chat tools, each by the name the model knows it by (`namespace.name`)."""
    tools = [
        Tool(type="function", function=located(("tools", i, "function"), partial(_function, name, tool)))
        for i, (name, (_, tool)) in enumerate(req.callable_functions().items())
    ]
    return tools or None


def _function(name: str, tool: FunctionTool) -> FunctionDefinition:
    return FunctionDefinition(name=name, description=tool.description, parameters=tool.parameters, strict=tool.strict)


def to_chat(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat-completions request for `req`, after the stored `history` of its previous responses, built
    typed; a refusal names the Responses parameter.

    `instructions` come first as a system message; those of earlier responses are not carried over (they
    are not input items), as OpenAI documents. Raises a 400 `GatewayError` for a function_call_output
    without its function_call, or a function_call without its output.
    """
    history_items = _ITEMS.validate_python(history)
    messages = _messages([*history_items, *req.items()], first_request_index=len(history_items))
    if req.instructions:
        messages.insert(0, SystemMessage(role="system", content=req.instructions))
    return translated(RESPONSES, lambda: _chat(req, messages))


def _chat(req: ResponsesRequest, messages: list[Message]) -> ChatCompletionRequest:
    tools = _tools(req)  # before tool_choice: a name too long for a tool is named at the tool, as in place
    return ChatCompletionRequest(
        model=req.model,
        messages=messages,
        # the Responses API has no prefill: a final assistant message is followed by a new turn
        continue_final_message=False if messages and messages[-1].role == "assistant" else None,
        tools=tools,
        tool_choice=_tool_choice(req),
        parallel_tool_calls=req.parallel_tool_calls,
        max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        user=req.user,
        response_format=_response_format(req),
        reasoning_effort=req.reasoning.effort if req.reasoning is not None else None,
        stream=req.streaming,
        stream_options=StreamOptions(include_usage=True) if req.streaming else None,
    )


# -- response ---------------------------------------------------------------------------------------------
def usage(chat_usage: CompletionUsage | None) -> dict[str, Any] | None:
    """Chat usage in the Responses API's shape (None: the engine sent none); `reasoning_tokens` is the engine's
    `completion_tokens_details.reasoning_tokens` (0 when it does not say); `cached_tokens` is the engine's
    count, 0 where it does not say (OpenAI's schema requires the field)."""
    if chat_usage is None:
        return None
    prompt, completion = chat_usage.prompt_tokens, chat_usage.completion_tokens
    return {
        "input_tokens": prompt,
        # Required by OpenAI's ResponseUsage: 0 where the engine does not say (LMDeploy; docs/api.md).
        "input_tokens_details": {"cached_tokens": chat_usage.cached_tokens or 0, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": chat_usage.reasoning_tokens},
        "total_tokens": chat_usage.total_tokens or prompt + completion,
    }


def _echo_tool_choice(req: ResponsesRequest) -> str | dict[str, Any]:
    choice = req.tool_choice
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "name": choice.name}
    return choice if isinstance(choice, str) else "auto"


def _echo_reasoning(req: ResponsesRequest) -> dict[str, Any]:
    """The effort served (the route fills in the model's default: `_with_effort`) and the summary asked."""
    reasoning = req.reasoning
    return (
        {"effort": reasoning.effort, "summary": reasoning.summary} if reasoning else {"effort": None, "summary": None}
    )


def _echo_format(req: ResponsesRequest) -> dict[str, Any]:
    fmt = req.text.format if req.text is not None else None
    return fmt.model_dump(mode="json", by_alias=True, exclude_none=True) if fmt is not None else {"type": "text"}


def response_object(
    req: ResponsesRequest,
    *,
    response_id: str,
    created_at: int,
    status: str,
    output: Sequence[OutputItem],
    model: str | None = None,
    usage: dict[str, Any] | None = None,
    incomplete_reason: str | None = None,
    error: dict[str, Any] | None = None,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """A Response object echoing the request's settings, as OpenAI returns it."""
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "completed_at": completed_at,
        "background": False,
        "error": error,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "metadata": dict(req.metadata or {}),
        "model": model or req.model,
        "output": [item.wire() for item in output],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": req.previous_response_id,
        "reasoning": _echo_reasoning(req),
        "store": req.stores,
        "temperature": req.temperature,
        "text": {"format": _echo_format(req)},
        "tool_choice": _echo_tool_choice(req),
        "tools": [tool.model_dump(mode="json") for tool in req.served_tools()],
        "top_p": req.top_p,
        "truncation": "disabled",
    }
    if usage is not None:  # not nullable in OpenAI's schema: absent until known
        response["usage"] = usage
    if req.user is not None:
        response["user"] = req.user
    return response


def incomplete_reason(finish_reason: str | None) -> str | None:
    """Why a response is incomplete, from the chat finish reason (None: it completed)."""
    return {"length": "max_output_tokens", "content_filter": "content_filter"}.get(finish_reason or "")


def message_item(item_id: str, text: str, *, status: ItemStatus, refusal: str | None = None) -> OutputMessage:
    content: list[OutputTextPart | OutputRefusal] = []
    if text or refusal is None:
        content.append(OutputTextPart(text=text))
    if refusal is not None:
        content.append(OutputRefusal(refusal=refusal))
    return OutputMessage(id=item_id, status=status, content=content)


def function_call_item(
    item_id: str, call_id: str, name: str, arguments: str, *, status: ItemStatus, req: ResponsesRequest | None = None
) -> OutputFunctionCall:
    """A function_call item; a call to a namespace's function (`req` says which) names `namespace` and `name`
    apart, as OpenAI's output items do."""
    namespace, local = None, name
    known = req.callable_functions().get(name) if req is not None else None
    if known is not None and known[0] is not None:
        namespace, local = known[0], known[1].name
    return OutputFunctionCall(
        id=item_id, call_id=call_id, name=local, namespace=namespace, arguments=arguments, status=status
    )


def reasoning_item(item_id: str, text: str, *, status: ItemStatus) -> OutputReasoning:
    """A reasoning item whose summary is the model's thinking, as Codex shows a reasoning summary (no engine here
    summarises, and none encrypts: `encrypted_content` is null)."""
    return OutputReasoning(id=item_id, summary=[SummaryTextPart(text=text)] if text else [], status=status)


def _output(message: ChatCompletionMessage, status: ItemStatus, req: ResponsesRequest) -> list[OutputItem]:
    output: list[OutputItem] = []
    if message.reasoning_content:
        output.append(reasoning_item(new_id("rs"), message.reasoning_content, status=status))
    text, refusal, calls = message.content, message.refusal, message.tool_calls or []
    if text or refusal is not None or not calls:
        output.append(message_item(new_id("msg"), text or "", status=status, refusal=refusal))
    for call in calls:
        call_id = call.id or new_id("call")
        name, arguments = call.function.name, call.function.arguments
        output.append(function_call_item(new_id("fc"), call_id, name, arguments, status=status, req=req))
    return output


def to_response(
    chat: ChatCompletion,
    req: ResponsesRequest,
    *,
    response_id: str,
    created_at: int,
    completed_at: int | None = None,
) -> dict[str, Any]:
    """The Response for the typed non-streamed chat answer: a message item for its first choice's text, then
    one function_call item per tool call; "length" makes it `incomplete` (reason `max_output_tokens`)."""
    choice = chat.choice
    reason = incomplete_reason(choice.finish_reason)
    status: ItemStatus = "incomplete" if reason else "completed"
    return response_object(
        req,
        response_id=response_id,
        created_at=created_at,
        completed_at=completed_at if completed_at is not None else created_at,
        status=status,
        output=_output(choice.message, status, req),
        model=chat.model,
        usage=usage(chat.usage),
        incomplete_reason=reason,
    )


def response_error(message: str, code: str) -> dict[str, Any]:
    """A failed Response's `error`: the gateway's code as the nearest member of OpenAI's enum (queue_full,
    rate_limit_exceeded → rate_limit_exceeded; context_length_exceeded → invalid_prompt; else server_error)."""
    return {"code": _RESPONSE_ERROR_CODES.get(code, "server_error"), "message": message}


# -- stored input items -----------------------------------------------------------------------------------
_ITEM_ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def stored_input(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's input items as a stored response keeps them: each with an `id` (the client's, or a new
    one), so that its input items list can be paged by item id."""
    items = req.input_items()
    for item in items:
        if not item.get("id"):
            item["id"] = new_id(_ITEM_ID_PREFIXES.get(str(item.get("type")), "item"))
    return items


def input_item_resource(item: dict[str, Any]) -> dict[str, Any]:
    """A stored input item as the input items list returns it: text content as parts, a status."""
    out = dict(item)
    if out.get("type") in ("message", "function_call", "function_call_output"):
        out.setdefault("status", "completed")
    if out.get("type") != "message":
        return out
    content = out.get("content")
    assistant = out.get("role") == "assistant"
    if isinstance(content, str):
        content = [{"type": "output_text" if assistant else "input_text", "text": content}]
    out["content"] = [
        {"annotations": [], "logprobs": [], **part} if part.get("type") == "output_text" else part
        for part in content or ()
    ]
    return out
