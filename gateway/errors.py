"""One error family for the whole gateway, and the single place it becomes an HTTP response or SSE frame.

    GatewayError(code, message, param)
      code: ErrorCode ─┬─ status  (STATUS table)
                       └─ type    (TYPE table)

    any exception ── as_gateway_error ──> GatewayError ── Envelope.response | Envelope.sse ──> the wire
                                                          (OPENAI: {"error": {...}}; ANTHROPIC: {"type": "error", ...})

`answer(envelope, exc, scope)` is the one function that turns an exception into an HTTP response; the
envelope is the one the request's route declares (`gateway.routes.boundary`), never guessed from the path.

`ErrorCode` and its two tables live in `backends/errors.py`, shared with the llama.cpp worker (whose error
bodies carry the same codes); they are re-exported here.

Client errors are raised explicitly; a stray builtin exception is an internal error (500), never a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import Any

from fastapi.exceptions import RequestValidationError
from starlette.datastructures import URL
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response
from starlette.types import Scope

from backends.errors import STATUS as STATUS  # re-exported: the gateway names them from here
from backends.errors import TYPE as TYPE
from backends.errors import ErrorCode as ErrorCode
from backends.errors import error_type
from backends.overflow import anthropic_overflow_message, overflow_counts

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


def internal_error() -> GatewayError:
    return GatewayError(ErrorCode.INTERNAL_ERROR, "internal error; see the gateway log for details")


# -- Anthropic's envelope --------------------------------------------------------------------------------
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}
"""HTTP status → Anthropic error type, as Anthropic documents them; our 503 (no worker, shutting down) is
reported as overload, Anthropic's own 529. Other 4xx are invalid requests, other 5xx api errors."""


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """An error body in Anthropic's envelope for an HTTP status."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error_body(error: GatewayError) -> dict[str, Any]:
    """A `GatewayError` in Anthropic's envelope; its `param`, which the envelope lacks, leads the message
    unless the message already names it as "param: ..." or "...: param". A prompt over the context says so in
    Anthropic's words ("prompt is too long: N tokens > M maximum"), which Claude Code acts on."""
    counts = overflow_counts(error.message) if error.code == ErrorCode.CONTEXT_LENGTH_EXCEEDED else None
    if counts is not None:
        return anthropic_error(error.status, anthropic_overflow_message(*counts))
    message = error.message
    named = message.startswith(f"{error.param}:") or message.endswith(f": {error.param}")
    if error.param and not named:
        message = f"{error.param}: {message}"
    return anthropic_error(error.status, message)


# -- the envelopes and the one boundary ------------------------------------------------------------------
class Envelope(Enum):
    """The error envelope an API speaks; each route declares one (`gateway.routes.boundary.speaking`)."""

    OPENAI = "openai"  # {"error": {"message", "type", "param", "code"}}
    ANTHROPIC = "anthropic"  # {"type": "error", "error": {"type", "message"}}

    def body(self, error: GatewayError) -> dict[str, Any]:
        return anthropic_error_body(error) if self is Envelope.ANTHROPIC else error.body()

    def response(self, error: GatewayError) -> JSONResponse:
        """`error` as an HTTP response: its status, its retry headers, this envelope's body."""
        return JSONResponse(self.body(error), status_code=error.status, headers=error.headers())

    def sse(self, error: GatewayError) -> bytes:
        """After stream headers are sent, an error goes out as one frame; the caller then ends the stream
        (OpenAI's: a `data:` line, then `[DONE]`; Anthropic's: an `event: error`)."""
        if self is Envelope.ANTHROPIC:
            data = json.dumps(self.body(error), ensure_ascii=False, separators=(",", ":"))
            return f"event: error\ndata: {data}\n\n".encode()
        return b"data: " + json.dumps(error.body()).encode() + b"\n\n"


HTTP_STATUS_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
}
"""Starlette's HTTP errors (an unmatched route, a method the route lacks, a body too large) → codes."""


def as_gateway_error(exc: Exception, scope: Scope) -> GatewayError:
    """Any exception as the error it answers with: a `GatewayError` as raised, Starlette's HTTP errors and
    FastAPI's validation errors as client errors (a 422 is our 400 naming `param`), anything else a bug (500)."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, HTTPException):
        method, path = scope.get("method", ""), URL(scope=scope).path  # as `Request.url.path` reads it
        message = {
            404: f"Unknown route: {method} {path}",
            405: f"Method {method} not allowed for {path}",
        }.get(exc.status_code, str(exc.detail))
        code = HTTP_STATUS_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
        return GatewayError(code, message, status=exc.status_code)
    if isinstance(exc, RequestValidationError):
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        return GatewayError(ErrorCode.INVALID_REQUEST, str(first["msg"]), param=param)
    return internal_error()


def answer(envelope: Envelope, exc: Exception, scope: Scope) -> Response:
    """The one translation from an exception to the HTTP response, in the route's declared `envelope`."""
    return envelope.response(as_gateway_error(exc, scope))


Render = Callable[[Scope, Exception], Response]
"""An error boundary: the response to `exc` for the request `scope` (`gateway.routes.boundary.ErrorBoundary`)."""
