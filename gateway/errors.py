"""One error family for the whole gateway, and the single place it becomes an HTTP response or SSE frame.

    GatewayError(code, message, param)
      code: ErrorCode ─┬─ status  (STATUS table)
                       └─ type    (TYPE table)

Client errors are raised explicitly; a stray builtin exception is an internal error (500), never a 400.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from starlette.responses import JSONResponse


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    INVALID_JSON = "invalid_json"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_API_KEY = "invalid_api_key"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    PERMISSION_DENIED = "permission_denied"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "request_too_large"
    RATE_LIMITED = "rate_limit_exceeded"
    QUEUE_FULL = "queue_full"
    WORKER_UNAVAILABLE = "worker_unavailable"
    SHUTTING_DOWN = "shutting_down"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_ERROR = "upstream_error"
    INTERNAL_ERROR = "internal_error"


STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.UNSUPPORTED_PARAMETER: 400,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,
    ErrorCode.INVALID_API_KEY: 401,
    ErrorCode.MODEL_NOT_ALLOWED: 403,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.WORKER_UNAVAILABLE: 503,
    ErrorCode.SHUTTING_DOWN: 503,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.UPSTREAM_ERROR: 502,
    ErrorCode.INTERNAL_ERROR: 500,
}

TYPE: dict[ErrorCode, str] = {
    ErrorCode.INVALID_API_KEY: "authentication_error",
    ErrorCode.MODEL_NOT_ALLOWED: "permission_error",
    ErrorCode.PERMISSION_DENIED: "permission_error",
    ErrorCode.MODEL_NOT_FOUND: "invalid_request_error",
    ErrorCode.NOT_FOUND: "invalid_request_error",
    ErrorCode.RATE_LIMITED: "rate_limit_error",
    ErrorCode.QUEUE_FULL: "rate_limit_error",
    ErrorCode.WORKER_UNAVAILABLE: "server_error",
    ErrorCode.SHUTTING_DOWN: "server_error",
    ErrorCode.UPSTREAM_TIMEOUT: "server_error",
    ErrorCode.UPSTREAM_ERROR: "server_error",
    ErrorCode.INTERNAL_ERROR: "server_error",
}

# Requests that can never succeed as sent: tell the SDK not to retry them.
NEVER_RETRY = {
    ErrorCode.INVALID_REQUEST,
    ErrorCode.INVALID_JSON,
    ErrorCode.UNSUPPORTED_PARAMETER,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED,
    ErrorCode.INVALID_API_KEY,
    ErrorCode.MODEL_NOT_ALLOWED,
    ErrorCode.PERMISSION_DENIED,
    ErrorCode.MODEL_NOT_FOUND,
    ErrorCode.NOT_FOUND,
    ErrorCode.METHOD_NOT_ALLOWED,
    ErrorCode.BODY_TOO_LARGE,
}

MAX_RETRY_AFTER_S = 60


class GatewayError(Exception):
    """An error with an OpenAI rendering; `retry_after_s` adds a Retry-After header (capped at 60 s)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        retry_after_s: float | None = None,
        status: int | None = None,
    ) -> None:
        message, param = _encodable(message), (_encodable(param) if param is not None else None)
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s
        self.status = status if status is not None else STATUS[code]

    @property
    def type(self) -> str:
        return TYPE.get(self.code, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code.value,
            }
        }

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.retry_after_s is not None:
            headers["retry-after"] = str(max(1, min(MAX_RETRY_AFTER_S, round(self.retry_after_s))))
        if self.code in NEVER_RETRY:
            headers["x-should-retry"] = "false"
        return headers


def _encodable(text: str) -> str:
    """`text` as valid Unicode: a message or parameter path that quotes a client's lone surrogate (`\udfff`)
    gets it as that escape, so that the error body can always be encoded."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode()
    return text


def error_response(error: GatewayError) -> JSONResponse:
    """The one translation from `GatewayError` to an HTTP response."""
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def sse_error_frame(error: GatewayError) -> bytes:
    """After stream headers are sent, an error goes out as one data frame; the caller then ends the stream."""
    return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


def internal_error() -> GatewayError:
    return GatewayError(ErrorCode.INTERNAL_ERROR, "internal error; see the gateway log for details")
