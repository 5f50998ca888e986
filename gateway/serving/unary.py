"""A non-streamed request from admission to accounting: `UnaryCall`, the unary mirror of `StreamSession`.

UnaryCall.run(disconnected, translate)
  ├─ scope.schedule(...)                       load, then admit, then call (the one order)
  ├─ Upstream.post(request)                    the worker's JSON answer | GatewayError
  ├─ the client goes away first                the call is cancelled (the worker aborts), 499
  ├─ read by kind, then rendered               a chat answer once into `ChatCompletion`, rendered by its API:
  │                                             `ChatCompletion.wire` for chat, `translate` for Messages and
  │                                             Responses; the other kinds' answers read and rendered as before
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
from gateway.serving.upstream import Unanswered, Upstream


@dataclass(frozen=True)
class UnaryResult:
    """A non-streamed answer: the rendered body, or `body=None` with 499 when the client went away."""

    body: dict[str, Any] | None
    status: int = 200


Tokens = tuple[int, int]
"""A request's (prompt, completion) token counts, as accounted."""

Translate = Callable[[ChatCompletion], dict[str, Any]]
"""An API's rendering of the typed non-streamed chat answer (`ChatCompletion.wire` for chat clients,
`translate.messages.to_message`, `translate.responses.to_response`); raises `GatewayError` when it cannot."""

_SHAPES: dict[RequestKind, Callable[[dict[str, Any]], dict[str, Any]]] = {
    RequestKind.COMPLETION: lambda data: Completion.model_validate(data).model_dump(mode="json"),
    RequestKind.RERANK: lambda data: RerankResponse.model_validate(data).render(),
}
"""The other kinds' answers read into their response type and rendered (an embeddings answer is relayed as
it is)."""


def _mismatch(exc: ValueError) -> GatewayError:
    return GatewayError(ErrorCode.UPSTREAM_ERROR, f"worker response does not match the API: {exc}")


def read_chat(data: dict[str, Any]) -> ChatCompletion:
    """The worker's chat answer, read once into the typed answer that every API renders."""
    try:
        return ChatCompletion.model_validate(data)
    except ValueError as exc:
        raise _mismatch(exc) from None


def normalize(kind: RequestKind, data: dict[str, Any]) -> dict[str, Any]:
    """One response shape whichever engine answered (required fields filled, extras dropped), for the kinds
    other than chat."""
    shape = _SHAPES.get(kind)
    if shape is None:
        return data
    try:
        return shape(data)
    except ValueError as exc:
        raise _mismatch(exc) from None


def read(kind: RequestKind, data: dict[str, Any]) -> tuple[ChatCompletion | dict[str, Any], Tokens]:
    """The worker's answer read by kind, with its (prompt, completion) token counts: a chat answer once into
    the typed `ChatCompletion`, the other kinds normalised into their rendered body."""
    if kind is RequestKind.CHAT:
        chat = read_chat(data)
        usage = chat.usage
        return chat, (usage.prompt_tokens, usage.completion_tokens) if usage is not None else (0, 0)
    body = normalize(kind, data)
    counts = body.get("usage") or {}
    return body, (int(counts.get("prompt_tokens", 0)), int(counts.get("completion_tokens", 0)))


def rendered(answer: ChatCompletion | dict[str, Any], translate: Translate | None) -> dict[str, Any]:
    """The body the client gets: a chat answer rendered by its API (`translate`, or `ChatCompletion.wire` for
    chat clients), another kind's as it was normalised."""
    if isinstance(answer, ChatCompletion):
        return (translate or ChatCompletion.wire)(answer)
    return answer


class UnaryCall:
    """One non-streamed request: its scope (model hold, slot, accounting), its worker and its engine request."""

    def __init__(
        self,
        scope: RequestScope,
        *,
        upstream: Upstream,
        request: AnyEngineRequest,
        load_wait_s: float | None,
        retryable: bool = False,
    ) -> None:
        self.scope = scope
        self._retryable = retryable  # an `Unanswered` leaves the scope to the caller: another replica may answer
        self._worker = upstream
        self._request = request
        self._load_wait_s = load_wait_s

    async def _call(self) -> dict[str, Any]:
        return await self.scope.schedule(lambda: self._worker.post(self._request), self._load_wait_s)

    async def run(self, disconnected: Callable[[], Awaitable[None]], translate: Translate | None) -> UnaryResult:
        """The answer (passed through `translate` before it is accounted, so a rendering that fails is counted
        with its error's status), or 499 when `disconnected` returns first; accounted exactly once. When
        `retryable`, an `Unanswered` is raised with the scope open: the caller sends the request to another
        replica (`RequestScope.abandon`) or finishes the scope with the error."""
        status: int = 500
        tokens: Tokens | None = None
        cached: int | None = None
        error: GatewayError | None = None
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
            answer, tokens = read(self.scope.ctx.kind, call.result())
            if isinstance(answer, ChatCompletion):
                answer, cached = _cached(answer, self.scope.deployment.capabilities.cached_tokens)
            payload = rendered(answer, translate)  # counted with its tokens even when the rendering fails
            status = 200
            return UnaryResult(payload)
        except GatewayError as exc:
            status, error = exc.status, exc
            raise
        finally:
            if not (self._retryable and isinstance(error, Unanswered)):
                self.scope.finish(status, tokens, error=error, cached=cached)


def _cached(chat: ChatCompletion, measured: bool) -> tuple[ChatCompletion, int | None]:
    """The answer as its client gets it, and the prompt tokens its engine served from cache (None: not said).
    An engine whose count is not measured (`EngineCapabilities.cached_tokens`) has its usage details removed."""
    usage = chat.usage
    if usage is None:
        return chat, None
    if not measured and usage.prompt_tokens_details is not None:
        usage = usage.model_copy(update={"prompt_tokens_details": None})
        return chat.model_copy(update={"usage": usage}), None
    return chat, usage.cached_tokens
