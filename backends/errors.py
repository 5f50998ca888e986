"""The one error vocabulary of gateway and workers: `ErrorCode`, with its HTTP status and OpenAI `type`.

    ErrorCode ─┬─ STATUS  (HTTP status)
               └─ TYPE    (OpenAI error `type`; `invalid_request_error` where absent)

The gateway raises `gateway.errors.GatewayError(code, ...)`; the llama.cpp worker raises
`backends.llamacpp.worker.httpkit.WorkerError(code, ...)`; both render `{"error": {"message", "type",
"param", "code"}}` with `code` this enum's value, so a worker's code reads the same at the gateway. This
module imports nothing of either side (backends never import gateway/).
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    INVALID_JSON = "invalid_json"
    UNSUPPORTED_PARAMETER = "unsupported_parameter"
    UNSUPPORTED_TASK = "unsupported_task"
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
    INVALID_API_KEY = "invalid_api_key"
    MODEL_NOT_ALLOWED = "model_not_allowed"
    PERMISSION_DENIED = "permission_denied"
    MODEL_NOT_FOUND = "model_not_found"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    BODY_TOO_LARGE = "request_too_large"
    REQUEST_TIMEOUT = "request_timeout"  # the body did not arrive within server.body_timeout_s
    CLIENT_CLOSED = "client_closed"  # the client left before its request was read (status 499: nobody sees it)
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"  # a POST body not declared as JSON
    RATE_LIMITED = "rate_limit_exceeded"
    QUEUE_FULL = "queue_full"
    WORKER_LOADING = "worker_loading"
    WORKER_UNAVAILABLE = "worker_unavailable"
    SHUTTING_DOWN = "shutting_down"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    UPSTREAM_ERROR = "upstream_error"
    INTERNAL_ERROR = "internal_error"


STATUS: dict[ErrorCode, int] = {
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.INVALID_JSON: 400,
    ErrorCode.UNSUPPORTED_PARAMETER: 400,
    ErrorCode.UNSUPPORTED_TASK: 400,
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: 400,
    ErrorCode.INVALID_API_KEY: 401,
    ErrorCode.MODEL_NOT_ALLOWED: 403,
    ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.MODEL_NOT_FOUND: 404,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.CLIENT_CLOSED: 499,
    ErrorCode.UNSUPPORTED_MEDIA_TYPE: 415,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.QUEUE_FULL: 429,
    ErrorCode.WORKER_LOADING: 503,
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
    ErrorCode.WORKER_LOADING: "server_error",
    ErrorCode.WORKER_UNAVAILABLE: "server_error",
    ErrorCode.SHUTTING_DOWN: "server_error",
    ErrorCode.UPSTREAM_TIMEOUT: "server_error",
    ErrorCode.UPSTREAM_ERROR: "server_error",
    ErrorCode.INTERNAL_ERROR: "server_error",
}


def error_type(code: ErrorCode) -> str:
    """OpenAI's `type` for `code`."""
    return TYPE.get(code, "invalid_request_error")
