"""A non-streamed request from admission to accounting: `UnaryCall`, the unary mirror of `StreamSession`.

UnaryCall.run(disconnected, translate)
  ├─ scope.schedule(...)                       load, then admit, then call (the one order)
  ├─ Upstream.post(request)                    the worker's JSON answer | GatewayError
  ├─ the client goes away first                the call is cancelled (the worker aborts), 499
  ├─ normalise by kind, then `translate`       a translated API's rendering (Messages, Responses)
  └─ scope.finish(...)                         exactly once, with the final status
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from backends.request import AnyEngineRequest, RequestKind
from gateway.errors import ErrorCode, GatewayError
from gateway.protocol import ChatCompletion, Completion
from gateway.protocol.rerank import RerankResponse
from gateway.serving.session import CLIENT_GONE, RequestScope
from gateway.serving.upstream import Upstream


@dataclass(frozen=True)
class UnaryResult:
    """A non-streamed answer: the normalised body, or `body=None` with 499 when the client went away."""

    body: dict[str, Any] | None
    status: int = 200


Translate = Callable[[dict[str, Any]], dict[str, Any]]
"""An API translation layer's rendering of a non-streamed chat answer; raises `GatewayError` when it cannot."""

_SHAPES: dict[RequestKind, Callable[[dict[str, Any]], dict[str, Any]]] = {
    RequestKind.CHAT: lambda data: ChatCompletion.model_validate(data).wire(),
    RequestKind.COMPLETION: lambda data: Completion.model_validate(data).model_dump(mode="json"),
    RequestKind.RERANK: lambda data: RerankResponse.model_validate(data).render(),
}
"""Each kind's answer read into its response type and rendered (an embeddings answer is relayed as it is)."""


def normalize(kind: RequestKind, data: dict[str, Any]) -> dict[str, Any]:
    """One response shape whichever engine answered (required fields filled, extras dropped)."""
    shape = _SHAPES.get(kind)
    if shape is None:
        return data
    try:
        return shape(data)
    except ValueError as exc:
        raise GatewayError(ErrorCode.UPSTREAM_ERROR, f"worker response does not match the API: {exc}") from None


class UnaryCall:
    """One non-streamed request: its scope (model hold, slot, accounting), its worker and its engine request."""

    def __init__(
        self, scope: RequestScope, *, upstream: Upstream, request: AnyEngineRequest, load_wait_s: float | None
    ) -> None:
        self.scope = scope
        self._worker = upstream
        self._request = request
        self._load_wait_s = load_wait_s

    async def _call(self) -> dict[str, Any]:
        return await self.scope.schedule(lambda: self._worker.post(self._request), self._load_wait_s)

    async def run(self, disconnected: Callable[[], Awaitable[None]], translate: Translate | None) -> UnaryResult:
        """The answer (passed through `translate` before it is accounted, so a rendering that fails is counted
        with its error's status), or 499 when `disconnected` returns first; accounted exactly once."""
        status, tokens, error = 500, None, None
        try:
            call = asyncio.ensure_future(self._call())
            gone = asyncio.ensure_future(disconnected())
            try:
                done, _ = await asyncio.wait({call, gone}, return_when=asyncio.FIRST_COMPLETED)
            except BaseException:
                call.cancel()  # this handler was cancelled: never leave the request running unowned
                raise
            finally:
                gone.cancel()
            if call not in done:
                call.cancel()  # closing the connection makes the worker abort the generation
                with contextlib.suppress(BaseException):
                    await call
                status = CLIENT_GONE
                return UnaryResult(None, CLIENT_GONE)
            payload = normalize(self.scope.ctx.kind, call.result())
            usage = payload.get("usage") or {}
            tokens = (int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)))
            if translate is not None:
                payload = translate(payload)
            status = 200
            return UnaryResult(payload)
        except GatewayError as exc:
            status, error = exc.status, exc
            raise
        finally:
            self.scope.finish(status, tokens, error=error)
