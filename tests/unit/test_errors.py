"""The one error family renders OpenAI's envelope, status, Retry-After and x-should-retry."""

from __future__ import annotations

import json

from gateway.errors import STATUS, Envelope, ErrorCode, GatewayError


def test_every_code_has_a_status() -> None:
    assert set(STATUS) == set(ErrorCode)


def test_error_body_has_openai_fields_and_string_code() -> None:
    error = GatewayError(ErrorCode.MODEL_NOT_FOUND, "no such model", param="model")
    response = Envelope.OPENAI.response(error)
    assert response.status_code == 404
    assert json.loads(response.body) == {
        "error": {
            "message": "no such model",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    }
    assert response.headers["x-should-retry"] == "false"


def test_retry_after_is_capped_at_sixty_seconds() -> None:
    response = Envelope.OPENAI.response(GatewayError(ErrorCode.QUEUE_FULL, "busy", retry_after_s=600))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "60"
    assert "x-should-retry" not in response.headers


def test_sse_error_frame_is_one_data_line() -> None:
    frame = Envelope.OPENAI.sse(GatewayError(ErrorCode.WORKER_UNAVAILABLE, "worker died"))
    assert frame.startswith(b"data: {") and frame.endswith(b"\n\n")
    assert json.loads(frame[6:])["error"]["code"] == "worker_unavailable"
