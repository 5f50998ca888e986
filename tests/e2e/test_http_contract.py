"""Raw HTTP: SSE framing, OpenAI error envelopes with the right status, headers, connection reuse."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.e2e.conftest import MODEL, Gateway
from tests.openai_schema import assert_matches_openai

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "Say hi."}]


def assert_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert_matches_openai("ErrorResponse", body)
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code
    return body["error"]


def test_sse_framing_ends_with_done(gateway: Gateway) -> None:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 8, "stream": True}
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert raw.endswith("data: [DONE]\n\n")
    assert events[-1] == "data: [DONE]"
    for event in events[:-1]:
        assert event.startswith("data: {"), event
        assert_matches_openai("CreateChatCompletionStreamResponse", json.loads(event[6:]))
    first = json.loads(events[0][6:])
    assert first["choices"][0]["delta"]["role"] == "assistant"


def test_malformed_json_is_400(gateway: Gateway) -> None:
    response = httpx.post(
        gateway.base_url + "/chat/completions",
        content=b'{"model": ',
        timeout=10,
        headers={"content-type": "application/json"},
    )
    assert_error(response, 400, "invalid_json")


def test_schema_violation_is_400_never_422(gateway: Gateway) -> None:
    response = httpx.post(gateway.base_url + "/chat/completions", json={"model": MODEL, "messages": "hi"}, timeout=10)
    error = assert_error(response, 400, "invalid_request_error")
    assert error["param"] == "messages"


def test_unknown_model_is_404_also_when_streaming(gateway: Gateway) -> None:
    body = {"model": "nope", "messages": HELLO, "stream": True}
    assert_error(httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=10), 404, "model_not_found")
    assert_error(httpx.get(gateway.base_url + "/models/nope", timeout=10), 404, "model_not_found")


def test_unknown_route_is_404_and_wrong_method_405_in_the_envelope(gateway: Gateway) -> None:
    assert_error(httpx.get(gateway.base_url + "/nothing-here", timeout=10), 404, "not_found")
    assert_error(httpx.get(gateway.base_url + "/chat/completions", timeout=10), 405, "method_not_allowed")


def test_body_over_the_limit_is_413(gateway: Gateway) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 70_000}]}
    assert_error(httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=10), 413, "request_too_large")


def test_context_overflow_is_400_context_length_exceeded_when_streaming_too(gateway: Gateway) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 5000}], "stream": True}
    error = assert_error(
        httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30), 400, "context_length_exceeded"
    )
    assert "context" in error["message"]


def test_request_id_is_echoed_or_made(gateway: Gateway) -> None:
    echoed = httpx.get(gateway.base_url + "/models", headers={"x-request-id": "my-trace-42"}, timeout=10)
    assert echoed.headers["x-request-id"] == "my-trace-42"
    made = httpx.get(gateway.base_url + "/models", timeout=10)
    assert made.headers["x-request-id"].startswith("req_")
    assert "openai-processing-ms" in made.headers


def test_connection_stays_usable_after_errors(gateway: Gateway) -> None:
    with httpx.Client(base_url=gateway.base_url, timeout=60) as client:
        assert client.post("/chat/completions", content=b"nope").status_code == 415  # not declared as JSON
        assert (
            client.post("/chat/completions", content=b"nope", headers={"content-type": "application/json"}).status_code
            == 400
        )
        assert client.post("/chat/completions", json={"model": "x", "messages": HELLO}).status_code == 404
        ok = client.post("/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 2})
        assert ok.status_code == 200
        assert_matches_openai("CreateChatCompletionResponse", ok.json())


def test_health_and_ready(gateway: Gateway) -> None:
    assert httpx.get(gateway.url + "/health", timeout=5).json() == {"status": "ok"}
    ready = httpx.get(gateway.url + "/ready", timeout=5)
    assert ready.status_code == 200
    assert ready.json()["models"][MODEL]["state"] == "ready"
