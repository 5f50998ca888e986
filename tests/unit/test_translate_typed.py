"""The translated APIs build the typed chat request (issue 27, item 3): Messages and Responses requests become
`ChatCompletionRequest` objects made of the chat protocol's own models, never a dict validated after the
fact, and a refusal still names the client's parameter."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backends.request import FunctionCall, NamedToolChoice, ResponseFormat, Tool, ToolCall
from gateway.errors import GatewayError
from gateway.protocol.anthropic import CountTokensRequest, MessagesRequest
from gateway.protocol.chat_messages import (
    AssistantMessage,
    ImageUrlPart,
    SystemMessage,
    TextPart,
    ToolMessage,
    UserMessage,
)
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.parsing import parse_body
from gateway.protocol.requests import ChatCompletionRequest, StreamOptions
from gateway.protocol.responses_api import ResponsesRequest
from gateway.translate import messages, responses
from gateway.translate.params import MESSAGES, translated

WEATHER = {"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}
FUNCTION = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}


def anthropic(**fields: Any) -> MessagesRequest:
    body = {"model": "smol", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_body(json.dumps(body).encode(), MessagesRequest, dotted=True)


def openai(**fields: Any) -> ResponsesRequest:
    return parse_body(json.dumps({"model": "smol", "input": "hi", **fields}).encode(), ResponsesRequest)


TOOL_TURNS = [
    {"role": "user", "content": [{"type": "text", "text": "Weather?"},
                                 IMAGE]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": 1}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "no", "is_error": True},
                                 {"type": "text", "text": "And?"}]},
]  # fmt: skip


# -- Messages ---------------------------------------------------------------------------------------------
def test_a_messages_request_becomes_chat_message_models_in_order() -> None:
    chat = messages.to_chat(anthropic(system="Be brief.", tools=[WEATHER], messages=TOOL_TURNS))
    assert isinstance(chat, messages.MessagesChatRequest) and isinstance(chat, ChatCompletionRequest)
    system, user, assistant, tool, after = chat.messages
    assert system == SystemMessage(role="system", content="Be brief.")
    assert isinstance(user, UserMessage) and isinstance(user.content, list)
    text, image = user.content
    assert text == TextPart(type="text", text="Weather?")
    assert isinstance(image, ImageUrlPart) and image.image_url.url == f"data:image/png;base64,{PIXEL}"
    assert assistant == AssistantMessage(
        role="assistant",
        tool_calls=[ToolCall(id="toolu_1", function=FunctionCall(name="get_weather", arguments='{"c": 1}'))],
    )
    assert tool == ToolMessage(
        role="tool", tool_call_id="toolu_1", content="Error: no"
    )  # a tool_result: a tool message
    assert after == UserMessage(role="user", content=[TextPart(type="text", text="And?")])


def test_messages_tools_choice_and_format_are_the_chat_models() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = messages.to_chat(
        anthropic(
            tools=[WEATHER],
            tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            output_config={"format": {"type": "json_schema", "schema": schema}},
            stop_sequences=["END"],
            stream=True,
        )
    )
    [tool] = chat.tools or []
    assert isinstance(tool, Tool) and tool.function.name == "get_weather"
    assert tool.function.parameters == WEATHER["input_schema"]
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "get_weather"
    assert chat.parallel_tool_calls is False
    assert isinstance(chat.response_format, ResponseFormat) and chat.response_format.json_schema is not None
    assert chat.response_format.json_schema.schema_ == schema
    assert (chat.stop, chat.max_tokens, chat.stream) == (["END"], 16, True)
    assert chat.stream_options == StreamOptions(include_usage=True)
    engine = chat.to_engine(EngineTarget(model="w"))
    assert engine.tool_choice == chat.tool_choice and engine.include_prompt_usage  # the same objects reach the engine


@pytest.mark.parametrize(("mode", "chat_mode"), [("auto", "auto"), ("any", "required"), ("none", "none")])
def test_messages_tool_choice_modes(mode: str, chat_mode: str) -> None:
    assert messages.to_chat(anthropic(tools=[WEATHER], tool_choice={"type": mode})).tool_choice == chat_mode


def test_count_tokens_is_the_prompt_with_one_token_to_decode() -> None:
    body = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "tools": [WEATHER]}
    chat = messages.to_chat(parse_body(json.dumps(body).encode(), CountTokensRequest, dotted=True))
    assert chat.max_tokens == 1 and chat.stream is False and chat.tools is not None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_time"}}, "tool_choice.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"stop_sequences": [str(i) for i in range(17)]}, "stop_sequences"),  # the chat path's limit, renamed
        ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x"}]}]},
         "messages.0.content.0.tool_use_id"),  # the client's own path: not renamed to `messages`
    ],
)  # fmt: skip
def test_messages_refusals_name_the_clients_parameter(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(GatewayError) as caught:
        messages.to_chat(anthropic(**fields))
    assert caught.value.status == 400 and caught.value.param == param


# -- Responses --------------------------------------------------------------------------------------------
def test_responses_items_become_chat_message_models() -> None:
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "Check"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
    ]
    req = openai(
        instructions="Use tools.",
        tools=[FUNCTION],
        input=[
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            {"role": "developer", "content": "Short."},
            {"role": "user", "content": [{"type": "input_image", "image_url": f"data:image/png;base64,{PIXEL}"}]},
        ],
    )
    chat = responses.to_chat(req, history)
    assert [type(m) for m in chat.messages] == [
        SystemMessage, UserMessage, AssistantMessage, ToolMessage, SystemMessage, UserMessage,
    ]  # fmt: skip
    assistant = chat.messages[2]
    assert assistant == AssistantMessage(
        role="assistant",
        content=[TextPart(type="text", text="Checking.")],
        tool_calls=[ToolCall(id="c1", function=FunctionCall(name="get_weather", arguments="{}"))],
    )  # the text and the call after it: one assistant message
    assert chat.messages[3] == ToolMessage(role="tool", tool_call_id="c1", content="ok")
    assert chat.messages[4] == SystemMessage(role="developer", content="Short.")
    image = chat.messages[5].content
    assert isinstance(image, list) and isinstance(image[0], ImageUrlPart) and image[0].image_url.detail == "auto"


def test_responses_settings_are_the_chat_fields() -> None:
    req = openai(
        tools=[FUNCTION],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=32,
        text={"format": {"type": "json_object"}},
        input=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "He"}],
    )
    chat = responses.to_chat(req, [])
    assert isinstance(chat.tool_choice, NamedToolChoice) and chat.tool_choice.function.name == "get_weather"
    assert chat.max_completion_tokens == 32 and chat.max_tokens is None
    assert chat.response_format == ResponseFormat(type="json_object")
    assert chat.continue_final_message is False and not chat.continues_reply  # Responses never prefills


def test_a_function_name_too_long_for_the_chat_path_is_named_at_the_responses_tool() -> None:
    namespace = {"type": "namespace", "name": "n" * 60, "tools": [{"type": "function", "name": "f" * 10}]}
    with pytest.raises(GatewayError) as caught:
        responses.to_chat(openai(tools=[namespace]), [])
    assert caught.value.param == "tools[0].name" and caught.value.message.startswith("tools[0].name: ")


def test_a_named_responses_tool_choice_must_name_an_offered_function() -> None:
    with pytest.raises(GatewayError) as caught:
        openai(tools=[FUNCTION], tool_choice={"type": "function", "name": "get_time"})
    assert caught.value.param == "tool_choice" and "get_time" in caught.value.message


def test_a_misspelt_chat_field_in_a_translation_is_a_bug_not_a_dropped_parameter() -> None:
    """The chat request keeps unknown fields aside to refuse them by name; a translation must set none."""
    with pytest.raises(AssertionError, match="top_kk"):
        translated(MESSAGES, lambda: ChatCompletionRequest(model="m", messages=[UserMessage(role="user", content="hi")],
                                                            top_kk=3))  # fmt: skip
