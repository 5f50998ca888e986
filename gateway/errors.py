"""One error family for the whole gateway, and the single place it becomes an HTTP response or SSE frame.

    GatewayError(code, message, param)
      code: ErrorCode ─┬─ status  (STATUS table)
                       └─ type    (TYPE table)

`ErrorCode` and its two tables live in `backends/errors.py`, shared with the llama.cpp worker (whose error
bodies carry the same codes); they are re-exported here.

Client errors are raised explicitly; a stray builtin exception is an internal error (500), never a 400.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from backends.errors import STATUS as STATUS  # re-exported: the gateway names them from here
from backends.errors import TYPE as TYPE
from backends.errors import ErrorCode as ErrorCode
from backends.errors import error_type

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
    ErrorCode.UNSUPPORTED_MEDIA_TYPE,
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
        return error_type(self.code)

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
