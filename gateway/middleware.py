"""Pure ASGI middleware (no BaseHTTPMiddleware: it hides http.disconnect from streaming handlers)."""

from __future__ import annotations

import re
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ErrorCode, GatewayError, error_response

_SAFE_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class RequestIdMiddleware:
    """Echo the client's `x-request-id` (or make one) and add `openai-processing-ms` to every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        supplied = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-request-id"), None)
        request_id = supplied if supplied and _SAFE_ID.match(supplied) else f"req_{uuid.uuid4().hex}"
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["x-request-id"] = request_id
                headers["openai-processing-ms"] = str(int((time.monotonic() - started) * 1000))
            await send(message)

        await self.app(scope, receive, send_with_headers)


class BodyLimitMiddleware:
    """Refuse bodies over `max_bytes` with 413 (by Content-Length, and while reading chunked bodies)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> GatewayError:
        return GatewayError(ErrorCode.BODY_TOO_LARGE, f"request body exceeds the {self.max_bytes}-byte limit")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await error_response(self._too_large())(scope, receive, send)
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
