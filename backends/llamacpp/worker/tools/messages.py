"""Messages and tools as chat templates read them (Hugging Face's conventions), natively or as text."""

from __future__ import annotations

import hashlib
import json
import string
from collections.abc import Callable, Sequence
from typing import Any

from backends.llamacpp.worker.tools.grammar import NO_PARAMETERS
from backends.llamacpp.worker.tools.signatures import signatures
from backends.request import EngineMessage, Tool, ToolCall

Message = dict[str, Any]

_ALPHANUMERIC = string.ascii_letters + string.digits


def tools_for_template(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """OpenAI-shaped tool dicts, with `description` and `parameters` always present (templates concatenate
    the one and iterate the other without checking)."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.function.name,
                "description": tool.function.description or "",
                "parameters": tool.function.parameters or NO_PARAMETERS,
            },
        }
        for tool in tools
    ]


def call_names(messages: Sequence[EngineMessage]) -> dict[str, str]:
    """Tool name by call id, from the assistant messages' calls (tool results often omit the name)."""
    return {call.id: call.function.name for m in messages for call in m.tool_calls or ()}


def template_messages(
    messages: Sequence[EngineMessage], map_id: Callable[[str], str] = lambda call_id: call_id
) -> list[Message]:
    """Message dicts for a template that renders tool calls and results itself.

    `content` is always a string. A `tool_calls` key is present only on messages that have calls, since
    templates test `'tool_calls' in message` or `message.tool_calls is defined`; each call's
    `function.arguments` is the parsed object, which templates iterate or `tojson`. `map_id` rewrites call
    ids for templates that demand their own shape (Mistral: 9 alphanumerics).
    """
    names = call_names(messages)
    out: list[Message] = []
    for m in messages:
        message: Message = {"role": m.role, "content": m.content or ""}
        if m.tool_calls:
            message["tool_calls"] = [_call_dict(call, map_id) for call in m.tool_calls]
        if m.role == "tool":
            message["tool_call_id"] = map_id(m.tool_call_id or "")
            message["name"] = m.name or names.get(m.tool_call_id or "", "")
        elif m.name:
            message["name"] = m.name
        out.append(with_thinking(message, m))
    return out


def with_thinking(message: Message, source: EngineMessage) -> Message:
    """`message` with an assistant turn's earlier thinking under the names templates read: Qwen3's
    `reasoning_content` (which it drops for turns before the last user query) and gpt-oss's `thinking`
    (kept across tool calls). The request may name it `reasoning_content` or `reasoning` (vLLM's)."""
    thinking = source.reasoning_content or source.reasoning
    if source.role == "assistant" and thinking:
        message["reasoning_content"] = thinking
        message["thinking"] = thinking
    return message


def _call_dict(call: ToolCall, map_id: Callable[[str], str]) -> dict[str, Any]:
    return {
        "id": map_id(call.id),
        "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments_value()},
    }


def short_call_id(call_id: str) -> str:
    """A 9-character alphanumeric id for `call_id`, the same every time (Mistral's templates demand it)."""
    if len(call_id) == 9 and call_id.isalnum() and call_id.isascii():
        return call_id
    number = int.from_bytes(hashlib.sha256(call_id.encode()).digest()[:8], "big")
    chars = []
    for _ in range(9):
        number, digit = divmod(number, len(_ALPHANUMERIC))
        chars.append(_ALPHANUMERIC[digit])
    return "".join(chars)


def one_call_per_message(messages: list[Message]) -> list[Message]:
    """Assistant messages with several calls split into consecutive messages of one call each (Llama 3's
    templates raise on more than one)."""
    out: list[Message] = []
    for message in messages:
        calls = message.get("tool_calls") or []
        if len(calls) <= 1:
            out.append(message)
            continue
        out.extend(
            {**message, "content": message["content"] if i == 0 else "", "tool_calls": [c]} for i, c in enumerate(calls)
        )
    return out


def harmony_messages(messages: list[Message]) -> list[Message]:
    """Messages for gpt-oss's template, which renders an assistant turn's first call only, names each tool
    result after the call rendered before it, and refuses a call turn with both text and thinking: a turn
    of several calls becomes one turn per call, each followed by its result (matched by call id; results
    that match none follow the last), and a call turn's text joins its thinking (the analysis message)."""
    out: list[Message] = []
    i = 0
    while i < len(messages):
        message, i = messages[i], i + 1
        calls = message.get("tool_calls") or []
        if not calls:
            out.append(message)
            continue
        results: list[Message] = []
        while i < len(messages) and messages[i]["role"] == "tool":
            results.append(messages[i])
            i += 1
        out += _calls_then_results(_one_analysis(message), calls, results)
    return out


def _one_analysis(message: Message) -> Message:
    thinking, text = message.get("thinking"), message.get("content")
    if not (thinking and text):
        return message
    joined = thinking + "\n\n" + text
    return {**message, "content": "", "thinking": joined, "reasoning_content": joined}


def _calls_then_results(message: Message, calls: list[Any], results: list[Message]) -> list[Message]:
    out: list[Message] = []
    unused = list(results)
    for n, call in enumerate(calls):
        out.append(
            {**message, "tool_calls": [call]} if n == 0 else {"role": "assistant", "content": "", "tool_calls": [call]}
        )
        result = next((r for r in unused if r.get("tool_call_id") == call["id"]), None)
        if result is not None:
            unused.remove(result)
            out.append(result)
    return out + unused


# -- generic: tools described in the system prompt, calls and results written as text ----------------------


def tools_section(tools: Sequence[Tool]) -> str:
    """The system-prompt text that teaches a model without native tool support how to call `tools`: each
    tool as a compact signature (`signatures.py`: about half the tokens of its JSON schema)."""
    return (
        "# Tools\n\n"
        "You can call functions to help with the user's request. Each is listed as name(parameters), then what "
        "it does and what its parameters mean; `?` marks an optional parameter, `= value` its default:\n"
        f"<tools>\n{signatures(tools)}\n</tools>\n\n"
        "To call a function, reply with a JSON object holding its name and its arguments inside "
        "<tool_call></tool_call> tags, one block per call:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <arguments-as-a-json-object>}\n</tool_call>\n'
        "Function results come back to you inside <tool_response></tool_response> tags."
    )


def call_text(name: str, arguments: Any) -> str:
    """One call written the way the generic (and Hermes) syntax expects it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def text_messages(
    messages: Sequence[EngineMessage], tools: Sequence[Tool], *, system_role: bool = True
) -> list[Message]:
    """Messages for a template that knows only system, user and assistant turns.

    An assistant's calls become `<tool_call>` blocks after its text; consecutive tool results become one
    user turn of `<tool_response>` blocks; the tools section joins the first system message (or becomes
    one). Without `system_role` (the template raises on system turns) the system text and the section open
    the first user message instead, as llama.cpp does for such templates.
    """
    out = _text_turns(messages)
    section = tools_section(tools) if tools else ""
    if system_role:
        if section and out and out[0]["role"] == "system":
            out[0]["content"] = (out[0]["content"] + "\n\n" + section).lstrip()
        elif section:
            out.insert(0, {"role": "system", "content": section})
        return out
    system = out.pop(0)["content"] if out and out[0]["role"] == "system" else ""
    prefix = "\n\n".join(part for part in (system, section) if part)
    first_user = next((m for m in out if m["role"] == "user"), None)
    if prefix and first_user is not None:
        first_user["content"] = prefix + "\n\n" + first_user["content"]
    elif prefix:
        out.insert(0, {"role": "user", "content": prefix})
    return out


def _text_turns(messages: Sequence[EngineMessage]) -> list[Message]:
    """Calls as `<tool_call>` text after the assistant's own; runs of tool results as one user turn."""
    out: list[Message] = []
    after_tool = False
    for m in messages:
        if m.role == "tool":
            block = f"<tool_response>\n{m.content or ''}\n</tool_response>"
            if after_tool:
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block})
            after_tool = True
            continue
        after_tool = False
        parts = [m.content] if m.content else []
        parts += [call_text(c.function.name, c.function.arguments_value()) for c in m.tool_calls or ()]
        out.append(with_thinking({"role": m.role, "content": "\n".join(parts)}, m))
    return out
