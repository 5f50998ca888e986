"""Anthropic Messages translation: request validation, request → chat, chat.completion → Message, errors."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types
import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.responses import ChatCompletion
from gateway.translate import parse_body
from gateway.translate.messages import anthropic_error, anthropic_error_body, to_chat, to_message

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def request(**fields: Any) -> MessagesRequest:
    body = {"model": "smol", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_body(json.dumps(body).encode(), MessagesRequest, dotted=True)


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """What the gateway's one chat path makes of a translated request (raises its 400s)."""
    return parse_request(json.dumps(body).encode(), ChatCompletionRequest)


def translate(req: MessagesRequest | CountTokensRequest) -> dict[str, Any]:
    """`to_chat`'s typed chat request as JSON (fields at None left out), checked to be exactly what the chat
    path makes of that JSON: the same request and the same engine request."""
    chat = to_chat(req)
    body = chat.model_dump(mode="json", exclude_none=True, by_alias=True)
    again = parse_request(json.dumps(body).encode(), type(chat))
    assert again == chat
    assert again.to_engine(EngineTarget(model="w")) == chat.to_engine(EngineTarget(model="w"))
    return body


def completion(
    content: str | None = None, tool_calls: list[dict[str, Any]] | None = None, finish: str = "stop", **choice: Any
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "smol-served",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
    }


def tool_call(call_id: str, arguments: str, name: str = "get_weather") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def message(chat: dict[str, Any], req: MessagesRequest | None = None) -> dict[str, Any]:
    out = to_message(ChatCompletion.model_validate(chat), req or request(), message_id="msg_1")
    anthropic.types.Message.model_validate(out)
    return out


# -- request → chat ---------------------------------------------------------------------------------------
def test_system_and_sampling_map_onto_chat_fields() -> None:
    req = request(
        system=[
            {"type": "text", "text": "You are terse."},
            {"type": "text", "text": "Answer in French.", "cache_control": {"type": "ephemeral"}},
        ],
        stop_sequences=["\n\nHuman:"],
        temperature=0.3,
        top_p=0.9,
        top_k=40,
        metadata={"user_id": "u-1"},
        stream=True,
    )
    body = translate(req)
    assert body["messages"] == [
        {"role": "system", "content": "You are terse.\nAnswer in French."},
        {"role": "user", "content": "hi"},
    ]
    assert body["max_tokens"] == 64 and body["stop"] == ["\n\nHuman:"]
    assert (body["temperature"], body["top_p"], body["top_k"], body["user"]) == (0.3, 0.9, 40, "u-1")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    chat_request(body)


def test_tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages() -> None:
    req = request(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking both."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": [{"type": "text", "text": "no data"}],
                        "is_error": True,
                    },
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
    )
    body = translate(req)
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris and Rome?"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Checking both."}],
            "tool_calls": [tool_call("toolu_1", '{"city": "Paris"}'), tool_call("toolu_2", '{"city": "Rome"}')],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no data"},
        {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    chat_request(body)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "get_weather"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        ),
        ({"type": "auto", "disable_parallel_tool_use": True}, {"tool_choice": "auto", "parallel_tool_calls": False}),
    ],
)
def test_tool_choice_maps_onto_chat(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    body = translate(request(tools=[WEATHER], tool_choice=choice))
    assert {k: body[k] for k in expected} == expected
    assert ("parallel_tool_calls" in body) == ("parallel_tool_calls" in expected)
    chat_request(body)


def test_tool_results_and_tool_uses_must_pair_up() -> None:
    orphan = request(
        messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "1"}]}]
    )
    with pytest.raises(GatewayError) as caught:
        translate(orphan)
    assert caught.value.status == 400 and caught.value.param == "messages.0.content.0.tool_use_id"
    unanswered = request(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}],
            },
            {"role": "user", "content": "never mind"},
        ],
    )
    with pytest.raises(GatewayError) as caught:
        translate(unanswered)
    assert caught.value.param == "messages.1.content.0.id"


def test_a_final_assistant_message_is_a_prefill_the_chat_path_continues() -> None:
    body = translate(
        request(messages=[{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}])
    )
    assert body["messages"][-1] == {"role": "assistant", "content": "1, 2,"}
    assert chat_request(body).continues_reply


def test_output_config_format_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = translate(request(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"}))
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}


def test_count_tokens_request_translates_its_prompt_only() -> None:
    req = parse_body(
        json.dumps(
            {"model": "smol", "system": "S", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
        ).encode(),
        CountTokensRequest,
        dotted=True,
    )
    body = translate(req)
    assert body["messages"] == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert body["tools"][0]["function"]["name"] == "get_weather"
    assert body["max_tokens"] == 1  # one decoded token: count_tokens reads the prompt's usage


# -- validation and refusals ------------------------------------------------------------------------------
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [IMAGE]}]},
            "messages.1.content.0.type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages.0.content.0.type",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}]}
                ]
            },
            "messages.0.content.0.content.0.type",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "other"}}, "tool_choice.name"),
        ({"tool_choice": {"type": "any"}}, "tool_choice"),
        ({"mcp_servers": [{"type": "url", "url": "http://x", "name": "x"}]}, "mcp_servers"),
        ({"container": "c1"}, "container"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
            "messages.0.content.0.type",
        ),
    ],
)
def test_what_no_engine_can_honour_is_a_400_naming_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        request(**fields)
    assert caught.value.code == ErrorCode.UNSUPPORTED_PARAMETER and caught.value.param == param


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "smol", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
        ({"model": "smol", "max_tokens": 1, "messages": []}, "messages"),
        ({"model": "smol", "max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        (
            {"model": "smol", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text",
        ),
        (
            {"model": "smol", "max_tokens": 1, "temperature": 1.5, "messages": [{"role": "user", "content": "x"}]},
            "temperature",
        ),
        (
            {
                "model": "smol",
                "max_tokens": 1,
                "tool_choice": {"type": "sometimes"},
                "messages": [{"role": "user", "content": "x"}],
            },
            "tool_choice.type",
        ),
    ],
)
def test_invalid_fields_are_a_400_naming_the_param(body: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        parse_body(json.dumps(body).encode(), MessagesRequest, dotted=True)
    assert caught.value.code == ErrorCode.INVALID_REQUEST and caught.value.param == param


def test_thinking_left_to_the_model_is_accepted() -> None:  # and `enabled`: tests/unit/test_reasoning_messages.py
    assert request(thinking={"type": "disabled"}).thinking is not None
    assert request(thinking={"type": "adaptive"}).thinking is not None


# -- chat.completion → Message ----------------------------------------------------------------------------
def test_text_completion_is_an_end_turn_message() -> None:
    out = message(completion("Hello!"))
    assert out == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "smol",
        "content": [{"type": "text", "text": "Hello!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "output_tokens": 7,
            "cache_creation_input_tokens": 0,  # no cache_read_input_tokens: the usage says nothing of a cache
        },
    }


def test_tool_calls_are_tool_use_blocks_with_parsed_input_and_the_chat_ids() -> None:
    chat = completion("On it.", [tool_call("call_7", '{"city": "Oslo"}'), tool_call("call_8", "")], finish="tool_calls")
    out = message(chat, request(tools=[WEATHER]))
    assert out["content"] == [
        {"type": "text", "text": "On it."},
        {"type": "tool_use", "id": "call_7", "name": "get_weather", "input": {"city": "Oslo"}},
        {"type": "tool_use", "id": "call_8", "name": "get_weather", "input": {}},
    ]
    assert out["stop_reason"] == "tool_use"


def test_length_is_max_tokens() -> None:
    assert message(completion("Once", finish="length"))["stop_reason"] == "max_tokens"


def test_stop_sequence_is_reported_only_when_the_upstream_names_it() -> None:
    req = request(stop_sequences=["END"])
    assert message(completion("x", stop_reason="END"), req)[("stop_reason")] == "stop_sequence"
    assert message(completion("x", stop_reason="END"), req)["stop_sequence"] == "END"
    assert message(completion("x", matched_stop="END"), req)["stop_sequence"] == "END"
    assert message(completion("x"), req)["stop_reason"] == "end_turn"  # cannot tell: reported as a natural end
    assert message(completion("x", stop_reason="OTHER"), req)["stop_reason"] == "end_turn"


def test_arguments_that_are_not_a_json_object_are_an_upstream_error() -> None:
    with pytest.raises(GatewayError) as caught:
        message(completion(None, [tool_call("c", "[1, 2]")], finish="tool_calls"))
    assert caught.value.status == 502


def test_round_trip_keeps_tool_ids_and_inputs() -> None:
    """A Message's tool_use blocks sent back as the next request's assistant turn give back the same calls."""
    out = message(
        completion(None, [tool_call("call_1", '{"city":"Oslo"}')], finish="tool_calls"), request(tools=[WEATHER])
    )
    follow_up = request(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "Oslo?"},
            {"role": "assistant", "content": out["content"]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "3C"}]},
        ],
    )
    body = translate(follow_up)
    [call] = body["messages"][1]["tool_calls"]
    assert call["id"] == "call_1" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert body["messages"][2] == {"role": "tool", "tool_call_id": "call_1", "content": "3C"}
    chat_request(body)


# -- errors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (413, "request_too_large"),
        (422, "invalid_request_error"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "overloaded_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_error_envelope_type_follows_the_status(status: int, kind: str) -> None:
    body = anthropic_error(status, "nope")
    assert body == {"type": "error", "error": {"type": kind, "message": "nope"}}
    if kind != "request_too_large":  # documented by Anthropic, not (yet) in the SDK's union
        anthropic.types.ErrorResponse.model_validate(body)


def test_gateway_errors_render_with_their_param_in_the_message() -> None:
    error = GatewayError(ErrorCode.UNSUPPORTED_PARAMETER, "thinking 'enabled' is not supported", param="thinking")
    assert anthropic_error_body(error)["error"] == {
        "type": "invalid_request_error",
        "message": "thinking: thinking 'enabled' is not supported",
    }
    error = GatewayError(ErrorCode.INVALID_REQUEST, "max_tokens: missing", param="max_tokens")
    assert anthropic_error_body(error)["error"]["message"] == "max_tokens: missing"
    error = GatewayError(ErrorCode.INVALID_REQUEST, "missing required parameter: max_tokens", param="max_tokens")
    assert anthropic_error_body(error)["error"]["message"] == "missing required parameter: max_tokens"
    assert anthropic_error_body(GatewayError(ErrorCode.QUEUE_FULL, "busy"))["error"]["type"] == "rate_limit_error"


def test_a_tool_call_cut_by_max_tokens_is_max_tokens_with_its_text_kept_not_a_502() -> None:
    """Seen live on TurboMind: a forced call cut by max_tokens arrives with half its arguments."""
    req = MessagesRequest.model_validate(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
         "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}
    )  # fmt: skip
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Par'}}
    chat = {
        "id": "chatcmpl-1", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                     "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13},
    }  # fmt: skip
    message = to_message(ChatCompletion.model_validate(chat), req, message_id="msg_1")
    assert message["stop_reason"] == "max_tokens"
    assert message["content"] == [{"type": "text", "text": '{"city": "Par'}]


SEARCH = {"name": "ToolSearch", "description": "Find tools", "input_schema": {"type": "object", "properties": {}}}


def test_deferred_tools_stay_out_of_the_prompt_until_a_tool_reference_loads_them() -> None:
    deferred = {**WEATHER, "defer_loading": True}
    before = translate(request(tools=[SEARCH, deferred]))
    assert [tool["function"]["name"] for tool in before["tools"]] == ["ToolSearch"]
    loaded = request(
        tools=[SEARCH, deferred],
        messages=[
            {"role": "user", "content": "Weather in Rome?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": [{"type": "tool_reference", "tool_name": "get_weather"}]}]},
        ],
    )  # fmt: skip
    after = translate(loaded)
    assert [tool["function"]["name"] for tool in after["tools"]] == ["ToolSearch", "get_weather"]
    assert after["messages"][-1] == {"role": "tool", "tool_call_id": "t1", "content": "Tool loaded: get_weather"}


def test_only_deferred_tools_means_no_tools_and_naming_one_in_tool_choice_is_a_400() -> None:
    deferred = {**WEATHER, "defer_loading": True}
    assert "tools" not in translate(request(tools=[deferred]))
    with pytest.raises(GatewayError) as caught:
        request(tools=[SEARCH, deferred], tool_choice={"type": "tool", "name": "get_weather"})
    assert (caught.value.param, caught.value.status) == ("tool_choice.name", 400)
