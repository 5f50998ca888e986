"""Request validation: every bad input is a 400 naming the parameter; nothing asked for is silently dropped."""

from __future__ import annotations

import json

import pytest

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import ChatCompletionRequest, CompletionRequest, parse_request

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
        ({"model": "m", "messages": USER, "top_p": 0}, "top_p"),
        ({"model": "m", "messages": USER, "presence_penalty": -3}, "presence_penalty"),
        ({"model": "m", "messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
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
        ({"n": 2}, "n"),
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"logprobs": True}, "logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logit_bias": {"50256": -100}}, "logit_bias"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ],
)
def test_parameters_no_engine_can_honour_are_refused_by_name(extra: dict, param: str) -> None:
    error = reject({"model": "m", "messages": USER, **extra})
    assert error.code is ErrorCode.UNSUPPORTED_PARAMETER
    assert error.param == param


def test_image_parts_are_refused_with_their_position() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "what?"}, image]}]}
    assert reject(body).param == "messages[0].content[1].type"


def test_malformed_json_is_invalid_json() -> None:
    error = reject(b'{"model": "m", "messages": [')
    assert error.code is ErrorCode.INVALID_JSON


def test_a_json_array_body_is_refused() -> None:
    assert reject(b"[1, 2]").code is ErrorCode.INVALID_REQUEST


def test_text_parts_are_flattened_for_the_engine_and_max_completion_tokens_wins() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_tokens": 99,
        "max_completion_tokens": 7,
    }
    request = parse_request(json.dumps(body).encode(), ChatCompletionRequest)
    engine = request.engine_body()
    assert engine["messages"] == [{"role": "user", "content": "ab"}]
    assert engine["max_tokens"] == 7
    assert "max_completion_tokens" not in engine


def test_completion_prompt_list_of_one_is_accepted_and_two_refused() -> None:
    ok = parse_request(json.dumps({"model": "m", "prompt": ["x"]}).encode(), CompletionRequest)
    assert ok.engine_body()["prompt"] == "x"
    assert reject({"model": "m", "prompt": ["x", "y"]}, CompletionRequest).param == "prompt"


def test_unknown_top_level_fields_from_frontends_are_ignored() -> None:
    body = {"model": "m", "messages": USER, "metadata": {"chat_id": "1"}, "session_id": "abc"}
    request = parse_request(json.dumps(body).encode(), ChatCompletionRequest)
    assert "metadata" not in request.engine_body()
