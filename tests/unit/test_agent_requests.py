"""What Codex CLI and Claude Code send by default, translated: namespace tools, hosted web search, no output
limit, mid-conversation system messages (issue 22)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response

from gateway.errors import GatewayError
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.responses import ChatCompletion, ChatCompletionChunk
from gateway.protocol.responses_api import ResponsesRequest
from gateway.translate import ResponsesStream, messages, parse_body
from gateway.translate.responses import to_chat, to_response
from tests.responses_schema import assert_matches

typed = ChatCompletionChunk.model_validate  # the chat chunks the streams are fed, typed as the session yields them

SPAWN = {
    "type": "function",
    "name": "spawn_agent",
    "description": "Spawn a sub-agent.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]},
}
CLOSE = {
    "type": "function",
    "name": "close_agent",
    "description": "Close an agent.",
    "strict": False,
    "parameters": {"type": "object", "properties": {"target": {"type": "string"}}, "required": ["target"]},
}
NAMESPACE = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [SPAWN, CLOSE]}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {}}}
WEB_SEARCH = {"type": "web_search", "external_web_access": False}


def responses_request(**fields: Any) -> ResponsesRequest:
    return parse_body(json.dumps({"model": "smol", "input": "hi", **fields}).encode(), ResponsesRequest)


def chat_completion(tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "smol",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
    }  # fmt: skip


def call(call_id: str, name: str, arguments: str = "{}") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


# -- Codex: namespace tools ---------------------------------------------------------------------------------
def test_a_namespace_is_served_as_its_function_tools_named_namespace_dot_name() -> None:
    req = responses_request(tools=[EXEC, NAMESPACE])
    chat = to_chat(req, [])
    names = [tool.function.name for tool in chat.tools or ()]
    assert names == ["exec_command", "multi_agent_v1.spawn_agent", "multi_agent_v1.close_agent"]
    spawn = next(t for t in chat.tools or () if t.function.name.endswith("spawn_agent"))
    assert spawn.function.parameters == SPAWN["parameters"] and spawn.function.description == SPAWN["description"]


def test_a_call_to_a_namespaced_function_names_namespace_and_name_apart() -> None:
    req = responses_request(tools=[EXEC, NAMESPACE])
    chat = chat_completion(
        [call("call_1", "multi_agent_v1.spawn_agent", '{"message":"go"}'), call("call_2", "exec_command")]
    )
    response = to_response(ChatCompletion.model_validate(chat), req, response_id="resp_1", created_at=1)
    assert_matches("Response", response)
    Response.model_validate(response)
    spawned, executed = response["output"]
    assert (spawned["namespace"], spawned["name"], spawned["arguments"]) == (
        "multi_agent_v1",
        "spawn_agent",
        '{"message":"go"}',
    )
    assert executed["name"] == "exec_command" and "namespace" not in executed
    assert response["tools"][1]["type"] == "namespace"  # echoed as sent


def test_a_streamed_namespaced_call_names_namespace_and_name_apart() -> None:
    req = responses_request(tools=[NAMESPACE], stream=True)
    stream = ResponsesStream(req, response_id="resp_1", created_at=1)
    delta = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "multi_agent_v1.close_agent", "arguments": "{}"},
    }
    events = stream.feed(typed({"model": "smol", "choices": [{"index": 0, "delta": {"tool_calls": [delta]}}]}))
    finished = {"model": "smol", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    events += stream.feed(typed(finished))
    events += stream.finish()
    added = next(e for e in events if e["type"] == "response.output_item.added")
    done = next(e for e in events if e["type"] == "response.output_item.done")
    arguments_done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    for item in (added["item"], done["item"]):
        assert (item["namespace"], item["name"]) == ("multi_agent_v1", "close_agent")
    assert arguments_done["name"] == "close_agent"


def test_a_replayed_namespaced_call_is_the_qualified_name_again() -> None:
    replay = [
        {"type": "message", "role": "user", "content": "spawn one"},
        {"type": "function_call", "call_id": "call_1", "namespace": "multi_agent_v1", "name": "spawn_agent",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "agent-7"},
    ]  # fmt: skip
    chat = to_chat(responses_request(tools=[NAMESPACE], input=replay), [])
    calls = chat.messages[1].tool_calls or []
    assert [c.function.name for c in calls] == ["multi_agent_v1.spawn_agent"]


@pytest.mark.parametrize(
    ("tools", "param"),
    [
        ([{**NAMESPACE, "tools": [{"type": "custom", "name": "grammar_tool"}]}], "tools[0].tools[0].type"),
        ([NAMESPACE, {**NAMESPACE, "tools": [SPAWN]}], "tools[1].tools[0].name"),
    ],
)
def test_what_a_namespace_cannot_hold_is_a_400_naming_it(tools: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        responses_request(tools=tools)
    assert caught.value.status == 400 and caught.value.param == param


# -- Codex: hosted web search, no output limit ------------------------------------------------------------
def test_hosted_web_search_is_dropped_not_refused() -> None:
    req = responses_request(tools=[EXEC, WEB_SEARCH, {"type": "web_search_preview"}])
    assert req.dropped_tools() == ["web_search", "web_search_preview"]
    chat = to_chat(req, [])
    assert [t.function.name for t in chat.tools or ()] == ["exec_command"]


def test_forcing_hosted_web_search_is_still_a_400() -> None:
    with pytest.raises(GatewayError) as caught:
        responses_request(tools=[WEB_SEARCH], tool_choice={"type": "web_search_preview"})
    assert caught.value.param == "tool_choice"


def test_no_max_output_tokens_sends_no_limit_to_the_chat_path() -> None:
    chat = to_chat(responses_request(), [])
    assert chat.max_completion_tokens is None and chat.max_tokens is None


# -- Claude Code: mid-conversation system messages --------------------------------------------------------
CLAUDE_CODE_TURN = [
    {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
                                 {"type": "text", "text": "Say hello"}]},
    {"role": "system", "content": "Available agent types for the Agent tool: ..."},
]  # fmt: skip


def messages_request(
    turns: list[dict[str, Any]], kind: type[MessagesRequest | CountTokensRequest] = MessagesRequest
) -> Any:
    body = {"model": "smol", "max_tokens": 64, "system": "You are Claude Code.", "messages": turns}
    return parse_body(json.dumps(body).encode(), kind, dotted=True)


@pytest.mark.parametrize("kind", [MessagesRequest, CountTokensRequest])
def test_a_mid_conversation_system_message_stays_in_its_place(kind: type[MessagesRequest | CountTokensRequest]) -> None:
    brief = {"role": "system", "content": [{"type": "text", "text": "Be brief."}]}
    turns = [*CLAUDE_CODE_TURN, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again"}, brief]
    chat = messages.to_chat(messages_request(turns, kind))
    assert [m.role for m in chat.messages] == ["system", "user", "system", "assistant", "user", "system"]
    assert chat.messages[2].text().startswith("Available agent types")
    assert chat.messages[5].text() == "Be brief."
    assert chat.to_engine(EngineTarget(model="w")).messages is not None  # the chat path takes it


@pytest.mark.parametrize(
    ("turns", "param"),
    [
        ([{"role": "system", "content": "x"}, {"role": "user", "content": "hi"}], "messages.0.role"),
        (
            [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}, {"role": "system", "content": "y"}],
            "messages.2.role",
        ),
        (
            [{"role": "user", "content": "hi"}, {"role": "system", "content": "x"}, {"role": "user", "content": "y"}],
            "messages.1.role",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "a"},
                {"role": "system", "content": "x"},
            ],
            "messages.2.role",
        ),
        (
            [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]},
            ],
            "messages.1.content.0.type",
        ),
    ],
)
def test_system_messages_out_of_place_are_a_400_naming_them(turns: list[dict[str, Any]], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        messages.to_chat(messages_request(turns))
    assert caught.value.status == 400 and caught.value.param == param
