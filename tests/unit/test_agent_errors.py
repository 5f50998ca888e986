"""Errors and accounting the coding agents and Open WebUI act on (issue 22): context overflow in each API's
words, one failure code per failed Response, the access log naming what a refused body asked for, Ollama's
`format`, keep-alive events that clients count."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from backends.lmdeploy import LMDeployAdapter
from backends.overflow import overflow_counts, overflow_message
from gateway.errors import ErrorCode, GatewayError
from gateway.ops.auth import ANONYMOUS
from gateway.ops.metrics import Metrics
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.responses import ChatCompletionChunk, CompletionUsage
from gateway.protocol.responses_api import ResponsesRequest
from gateway.serving.session import RequestContext, account
from gateway.translate import MessagesStream, ResponsesStream, parse_body
from gateway.translate.messages import anthropic_error_body
from gateway.translate.messages import usage as messages_usage
from tests.responses_schema import assert_matches

typed = ChatCompletionChunk.model_validate  # the chat chunks the streams are fed, typed as the session yields them


def overflow(message: str) -> GatewayError:
    return GatewayError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, message, param="messages")


def test_an_overflow_says_openais_words_and_its_numbers_read_back() -> None:
    message = overflow_message(8192, 8473)
    assert message == (
        "This model's maximum context length is 8192 tokens. However, your messages resulted in 8473 tokens. "
        "Please reduce the length of the messages."
    )
    assert overflow_counts(message) == (8473, 8192)


def test_an_overflow_on_messages_is_anthropics_prompt_is_too_long() -> None:
    body = anthropic_error_body(overflow(overflow_message(8192, 8473)))
    assert body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: 8473 tokens > 8192 maximum"},
    }


def test_lmdeploys_overflow_is_normalised_to_openais_words() -> None:
    raw = {"object": "error", "message": "Input length (6010) must be smaller than the model context length (1024).",
           "code": 400, "type": "invalid_request_error"}  # fmt: skip
    err = LMDeployAdapter().normalize_error(400, json.dumps(raw).encode())
    assert err.code == "context_length_exceeded" and err.message == overflow_message(1024, 6010)
    assert (
        anthropic_error_body(overflow(err.message))["error"]["message"]
        == "prompt is too long: 6010 tokens > 1024 maximum"
    )


@pytest.mark.parametrize(
    ("code", "expected"),
    [("queue_full", "rate_limit_exceeded"), ("context_length_exceeded", "invalid_prompt"),
     ("upstream_error", "server_error")],
)  # fmt: skip
def test_a_failed_response_stream_has_one_code_in_its_error_event_and_its_response(code: str, expected: str) -> None:
    req = parse_body(json.dumps({"model": "m", "input": "hi", "stream": True}).encode(), ResponsesRequest)
    stream = ResponsesStream(req, response_id="resp_1", created_at=1)
    stream.start()
    error_event, failed = stream.fail("the queue timed out", code)
    assert error_event["type"] == "error" and failed["type"] == "response.failed"
    assert error_event["code"] == failed["response"]["error"]["code"] == expected
    assert_matches("ResponseErrorEvent", error_event)


def test_keepalives_are_events_clients_count() -> None:
    req = parse_body(json.dumps({"model": "m", "input": "hi", "stream": True}).encode(), ResponsesRequest)
    stream = ResponsesStream(req, response_id="resp_1", created_at=1)
    first = stream.keepalive()
    assert [e["type"] for e in first] == ["response.created", "response.in_progress", "keepalive"]
    again = stream.keepalive()  # OpenAI's own keep-alive, not the whole Response again
    assert again == [{"type": "keepalive", "sequence_number": 3}]
    messages_req = parse_body(
        json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}).encode(),
        MessagesRequest,
        dotted=True,
    )
    messages = MessagesStream(messages_req, message_id="msg_1")
    assert messages.keepalive() == [{"type": "ping"}]  # message_start waits for the first chunk's prompt usage
    assert messages.keepalive() == [{"type": "ping"}]


def test_the_access_log_names_the_model_a_refused_body_asked_for(caplog: pytest.LogCaptureFixture) -> None:
    ctx = RequestContext(request_id="req_1", principal=ANONYMOUS, started=0.0)
    with caplog.at_level(logging.INFO, logger="voltgate.access"):
        account(Metrics(gpu=False), ctx, "unknown", 400, None, named="claude-opus-4-8")
        account(Metrics(gpu=False), ctx, "smollm2-135m", 400, None, named="smollm2")
    logged = [json.loads(r.getMessage())["model"] for r in caplog.records]
    assert logged == ["claude-opus-4-8", "smollm2-135m"]


def chat(**fields: Any) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_request(json.dumps(body).encode(), ChatCompletionRequest)


def test_ollamas_format_json_is_json_mode_and_a_schema_is_a_json_schema() -> None:
    assert chat(format="json").response_format is not None
    assert chat(format="json").response_format.type == "json_object"  # type: ignore[union-attr]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = chat(format=schema).response_format
    assert fmt is not None and fmt.type == "json_schema"


@pytest.mark.parametrize("fields", [{"format": "yaml"}, {"format": "json", "response_format": {"type": "text"}}])
def test_an_ollama_format_that_cannot_be_honoured_is_a_400_naming_it(fields: dict[str, Any]) -> None:
    with pytest.raises(GatewayError) as caught:
        chat(**fields)
    assert caught.value.status == 400 and "format" in caught.value.message


def test_prefix_cache_hits_are_cache_read_input_tokens_on_messages() -> None:
    """Anthropic counts a prompt as input + cache_read + cache_creation; Claude Code sums them."""
    counted = messages_usage(CompletionUsage(prompt_tokens=9196, completion_tokens=3, total_tokens=9199,
                                             prompt_tokens_details={"cached_tokens": 9000}))  # fmt: skip
    assert counted == {"input_tokens": 196, "output_tokens": 3, "cache_creation_input_tokens": 0,
                       "cache_read_input_tokens": 9000}  # fmt: skip
    req = parse_body(
        json.dumps(
            {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        ).encode(),
        MessagesRequest,
        dotted=True,
    )
    stream = MessagesStream(req, message_id="msg_1")
    stream.feed(typed({"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": "stop"}]}))
    stream.feed(typed({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51,
                                          "prompt_tokens_details": {"cached_tokens": 48}}}))  # fmt: skip
    delta = stream.finish()[-2]
    assert delta["usage"]["input_tokens"] == 2 and delta["usage"]["cache_read_input_tokens"] == 48
