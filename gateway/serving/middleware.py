"""Pure ASGI middleware (no BaseHTTPMiddleware: it hides http.disconnect from streaming handlers)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import gc
import json
import logging
import re
import sys
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ErrorCode, GatewayError, Render, internal_error
from gateway.ops.auth import ANONYMOUS
from gateway.ops.metrics import Metrics
from gateway.serving.session import CLIENT_GONE, CONTEXT_KEY, RequestContext, account

log = logging.getLogger("voltgate")

ENDPOINTS = {
    "/v1/chat/completions": "chat", "/v1/completions": "completion", "/v1/embeddings": "embedding",
    "/v1/rerank": "rerank", "/v1/reranking": "rerank", "/v1/messages": "messages",
    "/v1/messages/count_tokens": "count_tokens", "/v1/models": "models",
}  # fmt: skip
"""The endpoint label of a path (bounded: every other path is counted under its first two segments)."""

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_EDGE_HEADERS = (b"x-request-id", b"openai-processing-ms")  # set here, last: a response never has two
ERROR_BODY_PEEK = 4096  # of an error response no route accounted: enough for its envelope's code and message


class RequestBodyMiddleware:
    """What a request body may cost before a route has read it, raised from `receive` as a `GatewayError` for
    the route to render and account (in its API's shape):

    - size: over `max_bytes` is a 413 (by Content-Length before a byte is read, rendered here with `render`;
      while reading a chunked body, raised);
    - time: the whole body must arrive within `timeout_s` of its headers (`server.body_timeout_s`), else a
      408; a body that never ends (a short Content-Length, a chunked body without its last chunk) cannot
      hold its connection;
    - a client that leaves before its body is complete is a 499 `client_closed` (no traceback: nobody is
      there to read the answer).

    After any of these, and whenever a route answers before reading the whole body (a 401 from the headers),
    the response closes the connection (`connection: close`): the rest of the body would be read as the
    next request. Once the body is complete, `receive` is the server's own (a
    streaming route waits on it for the client's disconnect, without a deadline).
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float, render: Render) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.render = render

    def _too_large(self) -> GatewayError:
        return GatewayError(ErrorCode.BODY_TOO_LARGE, f"request body exceeds the {self.max_bytes}-byte limit")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self.render(scope, self._too_large())(scope, receive, _closing(send))
            return
        deadline = time.monotonic() + self.timeout_s
        chunked = any(k == b"transfer-encoding" for k, _ in scope["headers"])
        received, complete, failed = 0, not chunked and length in (None, b"0"), False

        async def body_receive() -> Message:
            nonlocal received, complete, failed
            if complete:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                failed = True
                raise GatewayError(
                    ErrorCode.REQUEST_TIMEOUT, f"request body not received within {self.timeout_s:g} s"
                ) from None
            if message["type"] == "http.disconnect":
                failed = complete = True
                raise GatewayError(ErrorCode.CLIENT_CLOSED, "the client closed the connection before its body ended")
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                failed = True
                raise self._too_large()
            complete = not message.get("more_body", False)
            return message

        async def body_send(message: Message) -> None:  # a response before the body's end closes (a 401, say)
            await (_closing(send) if failed or not complete else send)(message)

        try:
            await self.app(scope, body_receive, body_send)
        finally:
            if received >= TRIM_AFTER_BYTES:
                await asyncio.to_thread(release_memory)


TRIM_AFTER_BYTES = 1 << 20
"""A request whose body was at least this large hands the heap it freed back to the OS when it ends."""
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6") if sys.platform == "linux" else None


def release_memory() -> None:
    """Collect garbage cycles, then return freed heap memory to the OS (glibc's `malloc_trim`; nothing
    elsewhere). A burst of large bodies otherwise leaves the gateway's RSS where the burst took it (4 x 8 MB
    prompts: 96 MiB idle, 208 MiB after; with this, 95 MiB): a refused request's traceback keeps its frames
    and their copies of the body alive until the cycle collector runs, and glibc keeps freed chunks in its
    arenas (its mmap threshold rises with the first large free, so later large allocations come from the
    heap). Runs on a thread, after a body of `TRIM_AFTER_BYTES` or more: tens of milliseconds, rarely."""
    gc.collect()  # a refusal's traceback holds its frames, and with them the body, until the cycle collector runs
    trim = getattr(_LIBC, "malloc_trim", None)  # musl has none
    if trim is not None:
        trim(0)


def _closing(send: Send) -> Send:
    """`send`, with `connection: close` on the response's start: what is left of the request is never read."""

    async def closing_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = [(k, v) for k, v in message.get("headers", ()) if k != b"connection"]
            message["headers"] = [*headers, (b"connection", b"close")]
        await send(message)

    return closing_send


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
    render), whatever raised it, body parsing included. Before the response has started: a 500 in the envelope
    its route declares (`render(scope, error)`: the app's `gateway.routes.boundary.ErrorBoundary`), with its
    `x-request-id`; the request is counted and gets its access-log line unless its route accounted it
    already; the exception is logged with its traceback. The exception is not re-raised, so the server keeps
    the keep-alive connection usable. After the response has started (a stream): the body is ended, so the
    client sees the end of a chunked response rather than a reset connection.

    Accounting: every request is counted (`voltgate:requests_total`) and gets one access-log line. A route
    that takes a request (its own `RequestContext` in the scope's state) accounts it; any other answer
    (404, 405, 413 by Content-Length, 401/403 on GET and admin routes, the status page, admin actions) is
    accounted here when it ends, with the status it was answered with and, for an error, its envelope's
    code and message; a client gone before any answer is a 499.

    One layer for all three, so a streamed response's every chunk passes one send wrapper here, not two.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics, render: Render) -> None:
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
        path = str(scope.get("path", ""))
        edge_ctx = state[CONTEXT_KEY] = RequestContext(request_id, ANONYMOUS, started, api=endpoint_label(path))
        response_started = False
        status, error_body = CLIENT_GONE, b""

        async def edge_send(message: Message) -> None:
            nonlocal response_started, status, error_body
            if response_started and status >= 400 and not error_body and message["type"] == "http.response.body":
                error_body = message.get("body", b"")[:ERROR_BODY_PEEK] or b" "
            if not response_started and message["type"] == "http.response.start":
                response_started, status = True, int(message["status"])
                headers = [(k, v) for k, v in message.get("headers", ()) if k not in _EDGE_HEADERS]
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                headers.append((b"openai-processing-ms", str(int((time.monotonic() - started) * 1000)).encode()))
                message["headers"] = headers
            await send(message)

        try:
            await self.app(scope, receive, edge_send)
        except Exception:
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
            await self.render(scope, internal_error())(scope, receive, edge_send)  # whatever it was: a bug
            return
        if state.get(CONTEXT_KEY) is edge_ctx and not edge_ctx.accounted:  # no route took it: accounted here
            account(self.metrics, edge_ctx, "unknown", status, None, _error_in(status, error_body))


def _error_in(status: int, body: bytes) -> GatewayError | None:
    """The error a response answered with (for the status page's recent errors): its envelope's code and
    message (OpenAI's or Anthropic's), or None for a success; a client that left before any answer is
    `client_closed`."""
    if status == CLIENT_GONE:
        return GatewayError(ErrorCode.CLIENT_CLOSED, "the client left before the response started")
    if status < 400:
        return None
    try:
        error = json.loads(body)["error"]
        code = ErrorCode(error.get("code") or error.get("type"))
        return GatewayError(code, str(error.get("message", "")), status=status)
    except (ValueError, TypeError, KeyError, AttributeError):
        return GatewayError(ErrorCode.INVALID_REQUEST, body[:200].decode("utf-8", "replace").strip(), status=status)
