"""Request validation: every bad input is a 400 naming the parameter; nothing asked for is silently dropped."""

from __future__ import annotations

import json

import pytest

from backends.request import IMAGE_MARKER, EngineRequest
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import ChatCompletionRequest, CompletionRequest, parse_request
from gateway.protocol.engine_requests import EngineTarget

USER = [{"role": "user", "content": "hi"}]


def reject(body: object, model_type: type = ChatCompletionRequest) -> GatewayError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with pytest.raises(GatewayError) as info:
        parse_request(raw, model_type)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": USER}, "model"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": "hi"}, "messages"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"model": "m", "messages": [{"role": "user"}]}, "messages[0].content"),
        ({"model": "m", "messages": USER, "max_tokens": -1}, "max_tokens"),
        ({"model": "m", "messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"model": "m", "messages": USER, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": USER, "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": USER, "top_p": -0.1}, "top_p"),
        ({"model": "m", "messages": USER, "presence_penalty": -3}, "presence_penalty"),
        ({"model": "m", "messages": USER, "stop": [str(i) for i in range(17)]}, "stop"),
        ({"model": "m", "messages": USER, "repetition_penalty": 20}, "repetition_penalty"),
        ({"model": "m", "messages": USER, "n": 17}, "n"),
        ({"model": "m", "messages": USER, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
        ({"model": "m", "messages": USER, "logit_bias": {"5": 101}}, "logit_bias.5"),
        ({"model": "m", "messages": USER, "logit_bias": {"abc": 1}}, "logit_bias.abc"),
        ({"model": "m", "messages": USER, "top_p": 1.5}, "top_p"),
        ({"model": "m", "messages": USER, "tools": [{"type": "custom", "custom": {"name": "x"}}]}, "tools[0].type"),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"model": "m", "messages": USER, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "m", "messages": USER, "stream": "yes please"}, "stream"),
    ],
)
def test_schema_violations_are_400_naming_the_parameter(body: dict, param: str) -> None:
    error = reject(body)
    assert error.code is ErrorCode.INVALID_REQUEST
    assert error.param == param
    assert error.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
        ({"top_logprobs": 2}, "top_logprobs"),
    ],
)
def test_parameters_no_engine_can_honour_are_refused_by_name(extra: dict, param: str) -> None:
    error = reject({"model": "m", "messages": USER, **extra})
    assert error.code is ErrorCode.UNSUPPORTED_PARAMETER
    assert error.param == param


def test_image_parts_outside_user_messages_are_refused_with_their_position() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": "m", "messages": [{"role": "system", "content": [{"type": "text", "text": "what?"}, image]}]}
    assert reject(body).param == "messages[0].content[1].type"


def test_user_image_parts_parse_with_a_marker_where_each_image_was() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}}
    bare = {"type": "image_url", "image_url": "data:image/gif;base64,R0lG"}  # the URL as a plain string
    content = [{"type": "text", "text": "a "}, image, {"type": "text", "text": " b "}, bare]
    parsed = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": content}]})
    message = parsed.messages[0]
    assert message.text_with_images() == f"a {IMAGE_MARKER} b {IMAGE_MARKER}"
    assert [(j, part.image_url.url[:14]) for j, part in message.image_parts()] == [
        (1, "data:image/png"),
        (3, "data:image/gif"),
    ]
    assert message.text() == "a  b "


def test_malformed_json_is_invalid_json() -> None:
    error = reject(b'{"model": "m", "messages": [')
    assert error.code is ErrorCode.INVALID_JSON


def test_a_json_array_body_is_refused() -> None:
    assert reject(b"[1, 2]").code is ErrorCode.INVALID_REQUEST


def engine(body: dict, model_type: type = ChatCompletionRequest, **kwargs: object) -> EngineRequest:
    parsed = parse_request(json.dumps(body).encode(), model_type)
    target = EngineTarget(
        model="worker-name",
        default_max_tokens=kwargs.get("default_max_tokens"),  # type: ignore[arg-type]
        max_tokens_cap=kwargs.get("cap"),  # type: ignore[arg-type]
        clamp=bool(kwargs.get("clamp", False)),
    )
    return parsed.to_engine(target)  # type: ignore[no-any-return]


def test_text_parts_are_flattened_for_the_engine_and_max_completion_tokens_wins() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_tokens": 99,
        "max_completion_tokens": 7,
    }
    request = engine(body)
    assert request.wire()["messages"] == [{"role": "user", "content": "ab"}]
    assert request.max_tokens == 7
    assert request.model == "worker-name"


def test_developer_messages_reach_the_engine_as_system_messages() -> None:
    body = {"model": "m", "messages": [{"role": "developer", "content": "be brief"}, *USER]}
    assert [m.role for m in engine(body).messages or ()] == ["system", "user"]


def test_a_request_the_gateway_accepts_is_accepted_by_the_worker_model() -> None:
    """The worker validates the wire body with the same model: what the gateway built must round-trip."""
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    body = {
        "model": "m",
        "messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
        "tools": [tool],
        "tool_choice": "required",
        "stop": [str(i) for i in range(8)],
        "repetition_penalty": 10,
        "top_p": 1,
        "stream": True,
    }  # fmt: skip
    request = engine(body)
    again = EngineRequest.model_validate_json(json.dumps(request.wire()))
    assert again == request
    assert request.include_usage  # the gateway always asks a streaming engine for usage


def test_a_named_tool_choice_must_name_one_of_the_tools() -> None:
    tool = {"type": "function", "function": {"name": "a"}}
    body = {
        "model": "m",
        "messages": USER,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "b"}},
    }
    with pytest.raises(GatewayError) as info:
        engine(body)
    assert info.value.param == "tool_choice"


def test_the_default_max_tokens_applies_when_the_request_gives_none() -> None:
    assert engine({"model": "m", "messages": USER}, default_max_tokens=64).max_tokens == 64
    assert engine({"model": "m", "messages": USER, "max_tokens": 5}, default_max_tokens=64).max_tokens == 5


def test_completion_prompt_list_of_one_is_accepted_and_two_refused() -> None:
    assert engine({"model": "m", "prompt": ["x"]}, CompletionRequest).prompt == "x"
    assert reject({"model": "m", "prompt": ["x", "y"]}, CompletionRequest).param == "prompt"


def test_unknown_top_level_fields_from_frontends_are_ignored() -> None:
    body = {"model": "m", "messages": USER, "metadata": {"chat_id": "1"}, "session_id": "abc"}
    assert "metadata" not in engine(body).wire()


def test_frontend_spellings_map_to_ours() -> None:
    request = engine({"model": "m", "messages": USER, "repeat_penalty": 1.3, "num_predict": 12})
    assert (request.repetition_penalty, request.max_tokens) == (1.3, 12)


@pytest.mark.parametrize("name", ["mirostat", "tfs_z", "typical_p", "num_ctx"])
def test_generation_settings_we_lack_are_refused_by_name_not_ignored(name: str) -> None:
    error = reject({"model": "m", "messages": USER, name: 1})
    assert (error.code, error.param) == (ErrorCode.UNSUPPORTED_PARAMETER, name)


def test_a_final_assistant_message_is_continued_unless_turned_off() -> None:
    messages = [*USER, {"role": "assistant", "content": "The capital of France is"}]
    assert engine({"model": "m", "messages": messages}).continue_final_message
    assert not engine({"model": "m", "messages": messages, "continue_final_message": False}).continue_final_message
    assert not engine({"model": "m", "messages": USER}).continue_final_message
    assert reject({"model": "m", "messages": USER, "continue_final_message": True}).param == "continue_final_message"


def test_logprobs_n_and_logit_bias_reach_the_engine() -> None:
    body = {"model": "m", "messages": USER, "logprobs": True, "top_logprobs": 3, "n": 2, "logit_bias": {"42": -100}}
    request = engine(body)
    assert (request.logprobs, request.top_logprobs, request.n, request.logit_bias) == (True, 3, 2, {42: -100})
    legacy = engine({"model": "m", "prompt": "x", "logprobs": 2}, CompletionRequest)
    assert (legacy.logprobs, legacy.top_logprobs) == (True, 2)


def test_the_server_cap_rejects_or_clamps_as_configured() -> None:
    body = {"model": "m", "messages": USER, "max_completion_tokens": 900}
    with pytest.raises(GatewayError) as info:
        engine(body, cap=512)
    assert info.value.param == "max_completion_tokens"
    assert engine(body, cap=512, clamp=True).max_tokens == 512
    assert engine({"model": "m", "messages": USER}, cap=512).max_tokens == 512
    assert engine({"model": "m", "messages": USER}, default_max_tokens=64, cap=512).max_tokens == 64
