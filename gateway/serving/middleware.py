"""Pure ASGI middleware (no BaseHTTPMiddleware: it hides http.disconnect from streaming handlers)."""

from __future__ import annotations

import contextlib
import logging
import re
import time
import uuid
from collections.abc import Callable

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ErrorCode, GatewayError, internal_error
from gateway.ops.auth import ANONYMOUS
from gateway.ops.metrics import Metrics
from gateway.serving.session import CONTEXT_KEY, RequestContext, account

log = logging.getLogger("voltgate")

ENDPOINTS = {
    "/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding",
    "/v1/rerank": "rerank", "/v1/reranking": "rerank", "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens", "/v1/models": "models",
}  # fmt: skip
"""The endpoint label of a path (bounded: every other path is counted under its first two segments)."""

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_EDGE_HEADERS = (b"x-request-id", b"openai-processing-ms")  # set here, last: a response never has two


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413 (by Content-Length, in the route's API shape: `render`; and
    while reading chunked bodies, raised for the route to render)."""

    def __init__(self, app: ASGIApp, max_bytes: int, render: Callable[[str, GatewayError], Response]) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.render = render

    def _too_large(self) -> GatewayError:
        return GatewayError(ErrorCode.BODY_TOO_LARGE, f"request body exceeds the {self.max_bytes}-byte limit")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self.render(str(scope.get("path", "")), self._too_large())(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited_receive, send)


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return ENDPOINTS[path]
    if path.startswith("/v1/responses"):
        return "responses"
    if path.startswith("/v1/models/"):
        return "models"
    return "admin" if path.startswith("/admin") else "other"


class RequestEdgeMiddleware:
    """Every HTTP request's outermost layer: its id, and the one place an unexpected exception becomes an answer.

    Request id: the client's `x-request-id` is echoed (or one is made), and every response carries it and
    `openai-processing-ms`.

    Error boundary: an exception that reaches here (a bug: anything but a `GatewayError`, which the routes
    render), whatever raised it, body parsing included. Before the response has started: a 500 in the route's
    API shape (`render(path, error)`: OpenAI's envelope, Anthropic's on /v1/messages), with its
    `x-request-id`; the request is counted and gets its access-log line unless its route accounted it
    already; the exception is logged with its traceback. The exception is not re-raised, so the server keeps
    the keep-alive connection usable. After the response has started (a stream): the body is ended, so the
    client sees the end of a chunked response rather than a reset connection.

    One layer for both, so a streamed response's every chunk passes one send wrapper here, not two.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, render: Callable[[str, GatewayError], Response]) -> None:
        self.app = app
        self.metrics = metrics
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        supplied = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = supplied if supplied and _SAFE_ID.match(supplied) else f"req_{uuid.uuid4().hex}"
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        response_started = False

        async def edge_send(message: Message) -> None:
            nonlocal response_started
            if not response_started and message["type"] == "http.response.start":
                response_started = True
                headers = [(k, v) for k, v in message.get("headers", ()) if k not in _EDGE_HEADERS]
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                headers.append((b"openai-processing-ms", str(int((time.monotonic() - started) * 1000)).encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, edge_send)
        except Exception:
            path = str(scope.get("path", ""))
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if response_started:
                with contextlib.suppress(Exception):
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            ctx = state.get(CONTEXT_KEY)
            if not isinstance(ctx, RequestContext):
                ctx = RequestContext(request_id, ANONYMOUS, started, api=endpoint_label(path))
            if not ctx.accounted:
                account(self.metrics, ctx, "unknown", 500, None)
            await self.render(path, internal_error())(scope, receive, edge_send)
