"""Responses API translation: request validation, request → chat, chat.completion → Response."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response

from gateway.errors import GatewayError
from gateway.ops.store import ResponseStore
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.responses import ChatCompletion
from gateway.protocol.responses_api import ResponsesRequest
from gateway.translate import parse_body
from gateway.translate.responses import to_chat, to_response
from tests.responses_schema import assert_matches

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


def request(**fields: Any) -> ResponsesRequest:
    body = {"model": "smol", "input": "hi", **fields}
    return parse_body(json.dumps(body).encode(), ResponsesRequest)


def chat_request(body: dict[str, Any]) -> ChatCompletionRequest:
    """What the gateway's one chat path makes of a translated request (raises its 400s)."""
    return parse_request(json.dumps(body).encode(), ChatCompletionRequest)


def translate(req: ResponsesRequest, history: list[dict[str, Any]]) -> dict[str, Any]:
    """`to_chat`'s typed chat request as JSON (fields at None left out), checked to be exactly what the chat
    path makes of that JSON: the same request and the same engine request."""
    chat = to_chat(req, history)
    body = chat.model_dump(mode="json", exclude_none=True, by_alias=True)
    again = parse_request(json.dumps(body).encode(), type(chat))
    assert again == chat
    assert again.to_engine(EngineTarget(model="w")) == chat.to_engine(EngineTarget(model="w"))
    return body


def completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    finish: str = "stop",
    prompt_tokens: int = 12,
    completion_tokens: int = 5,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "smol",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def respond(chat: dict[str, Any], req: ResponsesRequest, response_id: str = "resp_1") -> dict[str, Any]:
    response = to_response(ChatCompletion.model_validate(chat), req, response_id=response_id, created_at=1_700_000_000)
    assert_matches("Response", response)
    Response.model_validate(response)
    return response


# -- request → chat ---------------------------------------------------------------------------------------
def test_string_input_is_one_user_message_after_the_instructions() -> None:
    body = translate(request(input="Hello", instructions="Be terse."), [])
    assert body["messages"] == [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hello"}]
    assert body["stream"] is False and "stream_options" not in body
    chat_request(body)


def test_settings_map_onto_chat_fields() -> None:
    req = request(
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=64,
        temperature=0.2,
        top_p=0.9,
        user="u1",
        stream=True,
        text={"format": {"type": "json_schema", "name": "city", "schema": {"type": "object"}, "strict": True}},
    )
    body = translate(req, [])
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert body["max_completion_tokens"] == 64
    assert (body["temperature"], body["top_p"], body["user"]) == (0.2, 0.9, "u1")
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": {"type": "object"}, "strict": True},
    }
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    chat_request(body)


def test_json_object_format_and_tool_choice_modes_pass_through() -> None:
    body = translate(request(text={"format": {"type": "json_object"}}, tools=[WEATHER], tool_choice="required"), [])
    assert body["response_format"] == {"type": "json_object"}
    assert body["tool_choice"] == "required"
    assert "response_format" not in translate(request(text={"format": {"type": "text"}}), [])


def test_message_items_with_parts_keep_their_roles_and_text() -> None:
    req = request(
        input=[
            {"role": "developer", "content": "Answer in French."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "Salut", "annotations": []}]},
            {"role": "user", "content": "Again"},
        ]
    )
    body = translate(req, [])
    assert body["messages"] == [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Salut"}]},
        {"role": "user", "content": "Again"},
    ]
    chat_request(body)


def test_input_ending_with_an_assistant_message_asks_for_a_new_turn_not_a_continuation() -> None:
    body = translate(request(input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}]), [])
    assert body["continue_final_message"] is False
    assert chat_request(body).continues_reply is False


def test_function_call_output_without_its_call_is_refused_naming_the_item() -> None:
    req = request(input=[{"type": "function_call_output", "call_id": "call_missing", "output": "42"}])
    with pytest.raises(GatewayError) as caught:
        translate(req, [])
    assert caught.value.status == 400
    assert caught.value.param == "input[0]"
    assert "call_missing" in caught.value.message


async def test_a_turn_after_tool_calls_without_their_outputs_is_refused(tmp_path: Any) -> None:
    store = ResponseStore(tmp_path)
    turn1 = request(input="Weather?", tools=[WEATHER])
    response1 = respond(completion(None, [tool_call("call_p", "get_weather", "{}")], finish="tool_calls"), turn1)
    await store.put(response1, turn1.input_items())
    with pytest.raises(GatewayError) as caught:
        translate(request(previous_response_id="resp_1", input="never mind"), await store.history("resp_1"))
    assert caught.value.status == 400 and caught.value.param == "input" and "call_p" in caught.value.message
    store.close()


def test_an_empty_reasoning_item_adds_nothing_and_the_effort_is_applied_and_echoed() -> None:
    req = request(
        input=[{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "user", "content": "Hi"}],
        reasoning={"effort": "high", "summary": "auto"},
    )
    body = translate(req, [])
    assert body["messages"] == [{"role": "user", "content": "Hi"}]
    assert body["reasoning_effort"] == "high"  # more: tests/unit/test_reasoning_responses.py
    response = respond(completion("Hello"), req)
    assert response["reasoning"] == {"effort": "high", "summary": "auto"}


# -- multi-turn: previous_response_id replays input and output items ---------------------------------
async def test_second_and_third_turns_replay_function_calls_and_outputs_by_call_id(tmp_path: Any) -> None:
    store = ResponseStore(tmp_path)
    turn1 = request(input="Weather in Paris and Rome?", tools=[WEATHER], instructions="Use tools.")
    calls = [
        tool_call("call_p", "get_weather", '{"city": "Paris"}'),
        tool_call("call_r", "get_weather", '{"city":"Rome"}'),
    ]
    response1 = respond(completion(None, calls, finish="tool_calls"), turn1, "resp_1")
    assert [(i["type"], i["call_id"], i["arguments"]) for i in response1["output"]] == [
        ("function_call", "call_p", '{"city": "Paris"}'),
        ("function_call", "call_r", '{"city":"Rome"}'),
    ]
    await store.put(response1, turn1.input_items())

    turn2 = request(
        previous_response_id="resp_1",
        tools=[WEATHER],
        input=[
            {"type": "function_call_output", "call_id": "call_p", "output": "18C"},
            {"type": "function_call_output", "call_id": "call_r", "output": [{"type": "input_text", "text": "25C"}]},
        ],
    )
    body2 = translate(turn2, await store.history("resp_1"))
    assert body2["messages"] == [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "tool_calls": calls},  # no content (None, left out of the JSON)
        {"role": "tool", "tool_call_id": "call_p", "content": "18C"},
        {"role": "tool", "tool_call_id": "call_r", "content": [{"type": "text", "text": "25C"}]},
    ]
    chat_request(body2)
    response2 = respond(completion("Paris 18C, Rome 25C."), turn2, "resp_2")
    await store.put(response2, turn2.input_items())

    turn3 = request(previous_response_id="resp_2", input="Thanks!")
    body3 = translate(turn3, await store.history("resp_2"))
    assert [m["role"] for m in body3["messages"]] == ["user", "assistant", "tool", "tool", "assistant", "user"]
    assert body3["messages"][4]["content"][0]["text"] == "Paris 18C, Rome 25C."
    assert "instructions" not in json.dumps(body3) and body3["messages"][0]["role"] == "user"
    chat_request(body3)
    store.close()


def test_assistant_text_and_following_function_calls_form_one_chat_message() -> None:
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "Check"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}", "id": "fc_1"},
    ]
    req = request(input=[{"type": "function_call_output", "call_id": "c1", "output": "ok"}], tools=[WEATHER])
    messages = translate(req, history)["messages"]
    assert messages[1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "Checking."}],
        "tool_calls": [tool_call("c1", "get_weather", "{}")],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "c1", "content": "ok"}


def test_input_items_round_trip_through_their_stored_json() -> None:
    req = request(input=[{"role": "user", "content": [{"type": "input_text", "text": "x"}]}])
    items = req.input_items()
    assert items == [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}]}]
    assert translate(request(input="y"), items)["messages"][0] == {
        "role": "user",
        "content": [{"type": "text", "text": "x"}],
    }
    assert request(input="plain").input_items() == [{"type": "message", "role": "user", "content": "plain"}]


# -- chat.completion → Response -------------------------------------------------------------------------
def test_text_completion_is_a_completed_response_with_one_message() -> None:
    req = request(instructions="Be nice.", metadata={"k": "v"}, temperature=0.5)
    response = respond(completion("Hello there"), req)
    assert response["id"] == "resp_1" and response["object"] == "response"
    assert response["status"] == "completed" and response["incomplete_details"] is None
    [message] = response["output"]
    assert message["type"] == "message" and message["role"] == "assistant" and message["id"].startswith("msg_")
    assert message["content"] == [{"type": "output_text", "text": "Hello there", "annotations": [], "logprobs": []}]
    assert response["usage"] == {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 17,
    }
    assert (response["instructions"], response["metadata"], response["temperature"]) == ("Be nice.", {"k": "v"}, 0.5)
    assert (
        response["store"] is True
        and response["tool_choice"] == "auto"
        and response["text"] == {"format": {"type": "text"}}
    )
    assert "output_text" not in response  # the SDKs compute it
    assert Response.model_validate(response).output_text == "Hello there"


def test_tool_calls_become_function_call_items_keeping_the_chat_call_ids() -> None:
    req = request(tools=[WEATHER], tool_choice={"type": "function", "name": "get_weather"})
    chat = completion("Let me check.", [tool_call("call_9", "get_weather", '{"city":"Oslo"}')], finish="tool_calls")
    response = respond(chat, req)
    message, call = response["output"]
    assert message["content"][0]["text"] == "Let me check."
    assert call["type"] == "function_call" and call["id"].startswith("fc_") and call["status"] == "completed"
    assert (call["call_id"], call["name"], call["arguments"]) == ("call_9", "get_weather", '{"city":"Oslo"}')
    assert response["tools"] == [WEATHER]
    assert response["tool_choice"] == {"type": "function", "name": "get_weather"}


def test_length_finish_is_incomplete_for_max_output_tokens() -> None:
    response = respond(completion("Once upon a", finish="length"), request(max_output_tokens=3))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["max_output_tokens"] == 3


def test_empty_generation_is_one_empty_message() -> None:
    response = respond(completion(""), request())
    assert response["output"][0]["content"] == [{"type": "output_text", "text": "", "annotations": [], "logprobs": []}]


def test_cached_prompt_tokens_are_reported() -> None:
    chat = completion("x")
    chat["usage"]["prompt_tokens_details"] = {"cached_tokens": 8}
    assert respond(chat, request())["usage"]["input_tokens_details"]["cached_tokens"] == 8


# -- validation and refusals ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search_preview"}, "tools": [{"type": "web_search_preview"}]}, "tool_choice"),
        ({"tools": [WEATHER, {"type": "file_search", "vector_store_ids": []}]}, "tools[1].type"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}]},
            "input[0].content[0].file_id",
        ),
        (
            {"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": "data:,"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
        ({"background": True}, "background"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ],
)
def test_what_no_engine_can_honour_is_a_400_naming_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        request(**fields)
    assert caught.value.status == 400 and caught.value.code == "unsupported_parameter"
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"temperature": 3}, "temperature"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"text": {"format": {"type": "json_schema", "schema": {}}}}, "text.format.name"),
        ({"tools": [{"type": "function", "name": "bad name!"}]}, "tools[0].name"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
    ],
)
def test_invalid_fields_are_a_400_naming_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        request(**fields)
    assert caught.value.status == 400 and caught.value.code == "invalid_request_error"
    assert caught.value.param == param


def test_missing_model_and_bad_json_are_400s() -> None:
    with pytest.raises(GatewayError) as caught:
        parse_body(b'{"input": "x"}', ResponsesRequest)
    assert caught.value.param == "model" and caught.value.message == "missing required parameter: model"
    with pytest.raises(GatewayError) as caught:
        parse_body(b"{", ResponsesRequest)
    assert caught.value.code == "invalid_json"


def test_hints_without_meaning_here_are_accepted() -> None:
    req = request(
        service_tier="auto",
        prompt_cache_key="k",
        safety_identifier="s",
        include=["reasoning.encrypted_content"],
        stream_options={"include_obfuscation": False},
        max_tool_calls=3,
        store=False,
    )
    assert req.stores is False
    assert respond(completion("x"), req)["store"] is False


def test_text_format_and_tool_settings_are_echoed_in_the_response() -> None:
    fmt = {"type": "json_schema", "name": "city", "schema": {"type": "object"}, "strict": True}
    req = request(text={"format": fmt}, tools=[WEATHER], tool_choice="none", parallel_tool_calls=False, user="u")
    response = respond(completion('{"a": 1}'), req)
    assert response["text"] == {"format": fmt}
    assert (response["tool_choice"], response["parallel_tool_calls"], response["user"]) == ("none", False, "u")
