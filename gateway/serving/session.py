"""One object per request from admission to accounting (`RequestScope`), and one per streamed request
from admission through the upstream response to teardown (`StreamSession`).

Unary and streamed requests share `RequestScope`: `try_load()` / `load()` hold the model in memory (waiting
for its load when it is not: `gateway.lifecycle.residency`), `try_admit()` / `admit()` take a slot, `schedule()` is the
one order of the two and the call (load, then admit, then call; `gateway.serving.unary.UnaryCall` and `StreamSession`
both go through it), `finish()` releases both (exactly once, whatever happened) and accounts the request
once: metrics, the key's in-flight count and one access-log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
from pydantic import ValidationError

from backends.base import RequestKind
from backends.request import AnyEngineRequest
from gateway.errors import Envelope, ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment
from gateway.lifecycle.residency import Hold, Residency
from gateway.ops.auth import Principal
from gateway.ops.live_speed import Flight
from gateway.ops.metrics import Metrics
from gateway.protocol.responses import ChatCompletionChunk
from gateway.serving.passthrough import relay_direct, renamed_reasoning
from gateway.serving.relay import (
    DONE_FRAME,
    ClientLine,
    KeepaliveChunk,
    StreamFailure,
    StreamStats,
    relay_stream,
    sse_frames,
)
from gateway.serving.upstream import Unanswered, Upstream

access_log = logging.getLogger("voltgate.access")
T = TypeVar("T")

CLIENT_GONE = 499
GENERATING = (RequestKind.CHAT, RequestKind.COMPLETION)  # the kinds whose speed `gateway.ops.live_speed` measures
PROGRESS_KEY = "voltgate_progress"  # the extension field of a loading-progress chunk (opt-in)
_PROGRESS = f'"{PROGRESS_KEY}":'.encode()  # as it appears in a progress chunk's JSON (never inside a string)
PROGRESS_INTERVAL_S = 1.0
"""With progress chunks on, how often a stream waiting for a load hears where it stands."""
CONTEXT_KEY = "voltgate_request"
"""Where a route keeps its `RequestContext` in the ASGI scope's state, so that `RequestEdgeMiddleware`
accounts a request that failed unexpectedly exactly once (not again when the route already did)."""


@dataclass
class RequestContext:
    request_id: str
    principal: Principal
    started: float
    kind: RequestKind = RequestKind.CHAT
    prompt: Any = None  # what the client sent, kept only when `server.log_prompts` is on
    api: str | None = None  # a translated API riding on `kind` ("responses", "messages"): the endpoint label
    accounted: bool = False  # its access-log line is written (`account`): at most one per request
    counted_chunks: bool = False  # a stream cut short before its usage frame: its chunks counted as tokens
    session_key: str | None = None  # the client's session, hashed (gateway.serving.prompt_prefix.session_key)


def account(
    metrics: Metrics,
    ctx: RequestContext,
    model: str,
    status: int,
    tokens: tuple[int, int] | None,
    error: GatewayError | None = None,
    *,
    named: str | None = None,
) -> None:
    """Count a request and write its one access-log line (every request that reached a route). `model` is the
    metric label (a configured model, or "unknown"); the log line keeps the name the body gave, `named`, when
    that is no configured model, so a refused request can be traced to what it asked for. A status of 400 or
    more also goes to the recent errors the status page shows, with `error`'s code and message (but a client
    that left before its body ended: a thousand of them would push every real error off the page)."""
    ctx.accounted = True
    endpoint = ctx.api or ctx.kind.value
    metrics.requests.labels(model, endpoint, str(status)).inc()
    if status >= 400 and (error is None or error.code is not ErrorCode.CLIENT_CLOSED):  # nobody's bug
        metrics.activity.error(
            request_id=ctx.request_id, model=model, endpoint=endpoint, status=status,
            code=error.code.value if error is not None else ("client_closed" if status == CLIENT_GONE else None),
            message=error.message if error is not None else None,
            key_id=ctx.principal.key_id if ctx.principal else None,
        )  # fmt: skip
    access_log.info(
        json.dumps(
            {
                "request_id": ctx.request_id,
                "model": model if named is None or model != "unknown" else named[:200],
                "endpoint": endpoint,
                "key_id": ctx.principal.key_id if ctx.principal else None,
                "status": status,
                "prompt_tokens": tokens[0] if tokens and not ctx.counted_chunks else None,
                "completion_tokens": tokens[1] if tokens else None,
                **({"tokens_from": "chunks"} if ctx.counted_chunks and tokens else {}),
                "latency_ms": round((time.monotonic() - ctx.started) * 1000, 1),
                **({"prompt": ctx.prompt} if ctx.prompt is not None else {}),
            }
        )
    )


class RequestScope:
    """A request's hold on its deployment: the model kept in memory, admission slot, the key's in-flight
    count, accounting.

    Contract: `finish()` is called exactly once per scope (later calls do nothing); it releases the slot
    and the model's hold if they were taken, so every path (success, error, cancellation, disconnect)
    releases exactly once.
    """

    def __init__(
        self,
        deployment: Deployment,
        ctx: RequestContext,
        metrics: Metrics,
        residency: Residency | None = None,
        *,
        units: int = 1,
    ) -> None:
        self.deployment = deployment
        self.ctx = ctx
        self.metrics = metrics
        self.residency = residency
        self.units = units  # admission slots: one per choice (`n`), as the worker runs each in a slot
        self.hold: Hold | None = None
        self.admitted_at: float | None = None
        self.flight: Flight | None = None  # at the worker, for the model's measured speed
        self.finished = False

    @property
    def model(self) -> str:
        return self.deployment.name

    def try_load(self) -> bool:
        """Hold the model if it is served now (pinned, or loaded); False when it has to be loaded first."""
        if self.hold is None and self.residency is not None:
            self.hold = self.residency.try_hold(self.deployment)
        return self.hold is not None or self.residency is None

    async def load(self, wait_s: float | None) -> None:
        """Hold the model, waiting for its load (one load for every waiter) for at most `wait_s`; raises a
        503 `GatewayError` (the load's error, or still loading) with Retry-After."""
        if self.try_load():
            return
        assert self.residency is not None
        try:
            self.hold = await self.residency.ensure_loaded(self.deployment, wait_s=wait_s)
        except GatewayError as exc:
            self.metrics.rejections.labels(self.model, exc.code.value).inc()
            raise

    def try_admit(self) -> bool:
        """Take a free slot without waiting; False when the request would have to queue."""
        if not self.deployment.admission.try_acquire(self.units):
            return False
        self._admitted(0.0)
        return True

    async def admit(self) -> None:
        """Wait in the deployment's FIFO queue for a slot; raises a 429 `GatewayError` when it is full."""
        admission = self.deployment.admission
        self.metrics.queue_depth.labels(self.model).set(admission.waiting + 1)
        try:
            waited = await admission.acquire(self.units)
        except GatewayError as exc:
            self.metrics.rejections.labels(self.model, exc.code.value).inc()
            raise
        finally:
            self.metrics.queue_depth.labels(self.model).set(admission.waiting)
        self._admitted(waited)

    def ready_now(self) -> bool:
        """Hold the model and take a slot if both are free now (the fast path: no waiting); False when the
        request must wait for either (then `schedule`)."""
        return self.try_load() and self.try_admit()

    async def schedule(self, call: Callable[[], Awaitable[T]], load_wait_s: float | None) -> T:
        """Load, then admit, then call: the one order every request follows (TGI's `Backend::schedule`),
        for a unary answer and for a stream alike. Raises the load's 503 or the queue's 429."""
        await self.load(load_wait_s)
        if not self.try_admit():
            await self.admit()
        return await call()

    def _admitted(self, waited_s: float) -> None:
        self.admitted_at = time.monotonic()
        if self.ctx.kind in GENERATING:
            self.flight = self.metrics.live.begin(self.model, self.units)
        self.metrics.queue_time.labels(self.model).observe(waited_s)
        self.metrics.running.labels(self.model).set(self.deployment.admission.running)

    def finish(
        self,
        status: int,
        tokens: tuple[int, int] | None = None,
        stats: StreamStats | None = None,
        error: GatewayError | None = None,
        cached: int | None = None,
    ) -> None:
        """Account the request once: release its slot and hold, count its tokens (`cached`: of the prompt,
        served from the engine's prefix cache, None when the engine does not say; a stream's are in `stats`)."""
        if self.finished:
            return
        self._release()
        if status == 200 and self.admitted_at is not None:
            self.deployment.worker.note_success()  # a request served: the crashes before it were no loop
        ctx, metrics, model = self.ctx, self.metrics, self.model
        self._measure(status == 200, tokens, stats)
        ctx.principal.done((tokens[0] + tokens[1]) if tokens else 0)
        if tokens:
            metrics.prompt_tokens.labels(model).inc(tokens[0])
            metrics.generation_tokens.labels(model).inc(tokens[1])
            metrics.count_cached(model, tokens[0], stats.cached_tokens if stats is not None else cached)
        metrics.latency.labels(model).observe(time.monotonic() - ctx.started)
        if stats is not None and stats.first_token_at is not None:
            # the first generated token; a stream with none (or none recognised) falls back to its first chunk
            first = stats.first_token_at if stats.first_content_at is None else stats.first_content_at
            metrics.ttft.labels(model).observe(first - ctx.started)
            itl = metrics.itl.labels(model)
            for gap in stats.inter_chunk_s:
                itl.observe(gap)
        account(metrics, ctx, model, status, tokens, error or (stats.error if stats is not None else None))

    def abandon(self) -> None:
        """Release the slot and hold, account nothing: the worker answered nothing (`Unanswered`) and the request
        goes on in another replica's scope, which accounts it once. Once, like `finish` (then a no-op)."""
        if self.finished:
            return
        self._release()
        if self.flight is not None:
            self.metrics.live.end(self.flight, completed=False, tokens=None)

    def _release(self) -> None:
        self.finished = True
        if self.admitted_at is not None:
            self.deployment.admission.release(time.monotonic() - self.admitted_at, units=self.units)
            self.metrics.running.labels(self.model).set(self.deployment.admission.running)
        if self.hold is not None:
            self.hold.release()

    def _measure(self, completed: bool, tokens: tuple[int, int] | None, stats: StreamStats | None) -> None:
        """Feed the model's measured speed (`gateway.ops.live_speed`): a stream with the relay's times, a unary
        request with none (its body arrives whole)."""
        if self.flight is None:
            return
        live = self.metrics.live
        if stats is None:
            sample = live.end(self.flight, completed=completed, tokens=tokens)
        else:
            sample = live.end(
                self.flight, completed=completed, tokens=tokens, streamed=True, first_content_at=stats.first_content_at,
                last_chunk_at=stats.last_chunk_at, cached_tokens=stats.cached_tokens or 0,
            )  # fmt: skip
        if sample is not None and tokens is not None:
            self.metrics.activity.completed(self.model, tokens[1], sample.ttft_s, sample.decode_tok_s)


class StreamSession:
    """A streamed request: the model's load and admission (with SSE comments while it waits), the upstream
    response, the relay, and one teardown.

    `open()` runs before the response headers: a request that can be served at once and whose upstream
    refuses it gets a real HTTP error status. One that must wait (for its model to load, or for a slot) longer
    than a keep-alive interval gets its headers and waits with SSE comments saying what it waits for (with
    `progress_data`, also `data:` chunks with no choices and a `voltgate_progress` object); errors after that
    are SSE error frames. `close()` is idempotent and safe from any task: it stops the wait, closes the
    upstream (the worker aborts the generation), drops or releases the admission and the model's hold, and
    accounts the request. The slot is released before the client sees `[DONE]`, so a client that sends its
    next request at once is never queued behind its own stream.
    """

    def __init__(
        self,
        scope: RequestScope,
        *,
        upstream: Upstream,
        request: AnyEngineRequest,
        include_usage: bool,
        keepalive_s: float,
        load_wait_s: float | None = None,
        progress_data: bool = False,
        keepalive_chunks: bool = False,
        retryable: bool = False,
    ) -> None:
        self.scope = scope
        self._retryable = retryable
        self._worker = upstream
        self._request = request
        self._include_usage = include_usage
        self._keepalive_s = keepalive_s
        self._load_wait_s = load_wait_s
        self._progress_data = progress_data
        self.stats = StreamStats()
        # the pass-through's keep-alives beside the body (`RelayResponse(line=...)`): empty chunks or comments
        self.line = ClientLine(self._keepalive_chunk() if keepalive_chunks else None)
        self._status = 200
        self._upstream: httpx.Response | None = None
        self._pending: asyncio.Task[None] | None = None

    async def open(self) -> None:
        """Hold the model, admit and open the upstream, or start waiting; raises `GatewayError` (before
        headers). When `retryable`, an `Unanswered` before the headers leaves the scope open: the caller sends
        the request to another replica (`RequestScope.abandon`) or finishes the scope with the error."""
        try:
            if self.scope.ready_now():
                await self._open_upstream()
                return
            headers_after_s = self._keepalive_s
            if self._progress_data and self.scope.hold is None:
                headers_after_s = min(headers_after_s, PROGRESS_INTERVAL_S / 2)  # show the load's progress early
            self._pending = asyncio.ensure_future(self._prepare())
            done, _ = await asyncio.wait({self._pending}, timeout=headers_after_s)
            if not done:
                return  # headers go out; `frames()` keeps the client informed while it waits
            self._pending.result()
            self._pending = None
        except GatewayError as exc:
            if self._retryable and isinstance(exc, Unanswered):
                raise  # nothing is open: no upstream, no wait (it ended before the headers)
            self._status = exc.status
            self.stats.error = exc  # accounted with its code (the relay never ran)
            await self.close()
            raise

    def _keepalive_chunk(self) -> KeepaliveChunk:
        completion = self.scope.ctx.kind is RequestKind.COMPLETION
        return KeepaliveChunk(
            object_name="text_completion" if completion else "chat.completion.chunk",
            id_=("cmpl-" if completion else "chatcmpl-") + self.scope.ctx.request_id,
            model=self.scope.model,
        )

    async def _prepare(self) -> None:
        await self.scope.schedule(self._open_upstream, self._load_wait_s)

    async def _open_upstream(self) -> None:
        self._upstream = await self._worker.open_stream(self._request)

    def frames(self) -> AsyncGenerator[bytes, None]:
        """The chat pass-through's SSE byte runs for the client, relayed in the body's own task
        (`gateway.serving.passthrough`; give `RelayResponse` this session's `line` for its keep-alives);
        always ends with `[DONE]`. A stream that did not wait is the relay itself: no generator between,
        unless the model names the thinking `reasoning` (config `reasoning.field`: `renamed_reasoning`)."""
        if self._pending is None and self._upstream is not None:
            frames = self._relay(direct=True)
        else:
            frames = self._frames(direct=True)
        if self.scope.deployment.reasoning.field == "reasoning":
            return renamed_reasoning(frames)
        return frames

    def _relay(self, *, direct: bool) -> AsyncGenerator[bytes, None]:
        """The relay over the open upstream: one task (`direct`, closing the session before `[DONE]` and at
        its end), or with a read-ahead task that yields the keep-alives in the stream (`relay_stream`, for the
        translated APIs' own keep-alive events)."""
        assert self._upstream is not None
        model, usage, keepalive = self.scope.model, self._include_usage, self._keepalive_s
        cached = self.scope.deployment.capabilities.cached_tokens
        if direct:
            return relay_direct(
                self._upstream, self.stats, self.line, model=model, include_usage=usage,
                keepalive_s=keepalive, on_done=self.close, cached_tokens=cached,
            )  # fmt: skip
        return relay_stream(
            sse_frames(self._upstream), self.stats, model=model, include_usage=usage, keepalive_s=keepalive,
            cached_tokens=cached,
        )  # fmt: skip

    async def _frames(self, *, direct: bool) -> AsyncGenerator[bytes, None]:
        """Any wait's comments, then the relayed runs; closes the session on `[DONE]` and at the end."""
        try:
            if self._pending is not None:
                async for frame in self._wait_pending():
                    # the pass-through's wait comments carry its keep-alive chunk too (progress chunks are one)
                    chunk = direct and self.line.chunk is not None and not self._progress_data
                    yield frame + self.line.frame if chunk and frame.startswith(b":") else frame
                if self._upstream is None:
                    return
            relay = self._relay(direct=direct)
            try:
                async for frame in relay:
                    if frame == DONE_FRAME:
                        await self.close()
                    yield frame
            finally:
                await relay.aclose()
        finally:
            await self.close()

    async def _wait_pending(self) -> AsyncIterator[bytes]:
        """While the model loads or the request queues: a comment at once, again when what it waits for
        changes or a keep-alive interval has passed; then the upstream, or one error frame and `[DONE]`."""
        assert self._pending is not None
        interval = min(self._keepalive_s, PROGRESS_INTERVAL_S) if self._progress_data else self._keepalive_s
        said, said_at = "", 0.0
        while not self._pending.done():
            phase, frame = self._waiting()
            if phase != said or time.monotonic() - said_at >= interval:
                yield frame
                said, said_at = phase, time.monotonic()
            await asyncio.wait({self._pending}, timeout=min(interval, PROGRESS_INTERVAL_S))
        try:
            self._pending.result()
            self._pending = None
        except GatewayError as exc:
            self.stats.error = exc
            self._status = exc.status
            yield Envelope.OPENAI.sse(exc)
            yield DONE_FRAME

    def _waiting(self) -> tuple[str, bytes]:
        """What the request waits for now, and the frame(s) that say so."""
        if self.scope.hold is not None or self.scope.residency is None:
            return "queued", b": waiting for a free slot\n\n"
        progress = self.scope.residency.progress(self.scope.deployment)
        elapsed = progress.elapsed_s
        frame = b": " + progress.text.replace("\n", " ").encode() + b"\n\n"
        if self._progress_data:
            kind = self.scope.ctx.kind
            body: dict[str, Any] = {
                "id": f"progress-{self.scope.ctx.request_id}",
                "object": "text_completion" if kind is RequestKind.COMPLETION else "chat.completion.chunk",
                "created": int(time.time()),
                "model": self.scope.model,
                "choices": [],
                PROGRESS_KEY: {"status": "loading", "message": progress.text, "elapsed_s": round(elapsed, 1)},
            }
            frame += b"data: " + json.dumps(body).encode() + b"\n\n"
        return progress.phase, frame

    async def chunks(self) -> AsyncGenerator[ChatCompletionChunk | StreamFailure | bytes, None]:
        """The stream for API translation layers: typed chunks, one `StreamFailure` if it broke after its
        headers, and the SSE comments said while it waits (bytes, a whole frame: valid in any SSE stream, pass
        them on). Loading-progress chunks are left out; a chunk that is not one is a failure, never dropped.
        (The chat pass-through relays bytes and never comes here: `frames()`.)"""
        async for run in self._frames(direct=False):
            for frame in run.split(b"\n\n"):
                if frame.startswith(b":"):
                    yield frame + b"\n\n"
                elif frame.startswith(b'data: {"error"'):
                    yield StreamFailure.from_frame(frame[6:])
                elif frame.startswith(b"data: ") and frame != DONE_FRAME.strip() and _PROGRESS not in frame:
                    try:
                        yield ChatCompletionChunk.model_validate_json(frame[6:])
                    except ValidationError as exc:
                        message = f"worker sent a chunk that does not match the API: {exc.errors()[0]['msg']}"
                        yield StreamFailure(502, message, ErrorCode.UPSTREAM_ERROR.value)

    def translation_failed(self, exc: GatewayError) -> None:
        """An API translation layer could not render this stream (say, a tool call Messages cannot stream in
        order) and ended it with an error event: the request is accounted with `exc`'s status, not as 200.
        Call it before the stream is closed."""
        self.stats.error = exc

    async def close(self) -> None:
        if self.scope.finished:
            return
        if self._pending is not None and not self._pending.done():
            self._pending.cancel()
            with contextlib.suppress(BaseException):
                await self._pending
        if self._upstream is not None:
            await self._upstream.aclose()
        if self.scope.finished:  # finished while we awaited
            return
        self.scope.finish(self._final_status(), self._tokens(), self.stats)

    def _final_status(self) -> int:
        stats = self.stats
        if stats.error is not None and self._status == 200:
            return stats.error.status
        if self._status == 200 and not stats.completed and stats.error is None:
            return CLIENT_GONE
        return self._status

    def _tokens(self) -> tuple[int, int] | None:
        """The usage frame's counts; a stream that ended before it (the client went away, the worker broke)
        counts the content chunks it relayed as its generated tokens (prompt tokens unknown: 0 in the metrics,
        null in the access-log line, which says `"tokens_from": "chunks"`)."""
        if self.stats.completion_tokens is not None:
            return (self.stats.prompt_tokens or 0, self.stats.completion_tokens)
        if not self.stats.chunks:
            return None
        self.scope.ctx.counted_chunks = True
        return (0, self.stats.content_chunks)
