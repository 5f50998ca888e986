"""The worker's HTTP surface: OpenAI chat/completions over the scheduler, /health and /v1/models."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from backends.llamacpp.native import ContextOptions, Model
from backends.llamacpp.scheduler import QueueFullError, Scheduler, SchedulerClosedError
from backends.llamacpp.text import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from backends.llamacpp.tickets import Failed, Finished, GenerationRequest, TextDelta, Ticket
from backends.llamacpp.wire import SSE_DONE, Kind, ParsedRequest, Renderer, WireError, new_id, parse_request, sse

log = logging.getLogger("voltgate.worker")


@dataclass(frozen=True)
class WorkerSpec:
    """Everything the worker process was started with."""

    model_path: Path
    model_name: str
    context: ContextOptions
    max_queue: int
    fill_gaps: bool = False
    sampling_threads: int = 1


class _Engine:
    """The loaded model with its chat template and scheduler."""

    def __init__(self, spec: WorkerSpec, on_fatal: Callable[[str], None]) -> None:
        self.model = Model(spec.model_path, spec.context)
        self._bos_text = self.model.special_text(self.model.bos_id)
        self.template = ChatTemplate(
            self.model.chat_template() or CHATML_TEMPLATE,
            bos_token=self._bos_text,
            eos_token=self.model.special_text(self.model.eos_id),
        )
        self.scheduler = Scheduler(
            self.model,
            slots=spec.context.n_seq_max,
            n_ctx_per_slot=spec.context.n_ctx_per_seq,
            n_batch=spec.context.n_batch,
            max_queue=spec.max_queue,
            fill_gaps=spec.fill_gaps,
            sampling_threads=spec.sampling_threads,
            on_fatal=on_fatal,
        )
        self.scheduler.start()

    def encode(self, parsed: ParsedRequest) -> list[int]:
        """Prompt tokens for a request (blocking: run it off the event loop)."""
        if parsed.messages is not None:
            text = self.template.render(parsed.messages)
            # Templates that write the BOS token themselves must not get a second one.
            add_bos = self.model.add_bos and not (self._bos_text and text.startswith(self._bos_text))
        else:
            text = parsed.prompt or ""
            add_bos = self.model.add_bos
        tokens = self.model.tokenize(text, add_special=add_bos)
        if not tokens and self.model.bos_id >= 0:
            tokens = [self.model.bos_id]
        return tokens

    def close(self) -> None:
        self.scheduler.stop()
        self.model.close()


class _WorkerState:
    def __init__(self, spec: WorkerSpec, on_fatal: Callable[[str], None]) -> None:
        self.spec = spec
        self.on_fatal = on_fatal
        self.engine: _Engine | None = None
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._lock = threading.Lock()

    def begin_shutdown(self) -> None:
        """Signal-handler safe: end queued and running requests now (with an error event) instead of
        letting the server's graceful shutdown wait for them and then cancel them mid-stream."""
        if self.loop is not None:
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        engine = self.engine
        if engine is not None:
            stats = engine.scheduler.stats()
            log.info("shutting down: ending %d running and %d queued requests", stats.slots_busy, stats.queue_depth)
            engine.scheduler.close()

    def load(self) -> None:
        """Runs on a loader thread while the server already answers /health with 503."""
        started = time.monotonic()
        try:
            engine = _Engine(self.spec, self.on_fatal)
        except Exception as exc:
            log.error("loading %s failed: %s", self.spec.model_path, exc)
            self.on_fatal(f"loading failed: {exc}")
            return
        with self._lock:
            if self._closing:
                engine.close()
                return
            self.engine = engine
        ctx = self.spec.context
        log.info(
            "loaded model %s from %s in %.1fs (slots=%d ctx/slot=%d n_batch=%d flash_attn=%s kv=%s%s%s%s)",
            self.spec.model_name,
            self.spec.model_path,
            time.monotonic() - started,
            ctx.n_seq_max,
            ctx.n_ctx_per_seq,
            ctx.n_batch,
            ctx.flash_attn,
            ctx.cache_type,
            " unified" if ctx.kv_unified else "",
            " fill_gaps" if self.spec.fill_gaps else "",
            f" sampling_threads={self.spec.sampling_threads}" if self.spec.sampling_threads > 1 else "",
        )

    def close(self) -> None:
        with self._lock:
            self._closing = True
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


def _error(exc: WireError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


def _failure(event: Failed) -> WireError:
    if event.retryable:
        return WireError(503, event.message, type="server_error", code="worker_unavailable")
    return WireError(500, event.message, type="server_error", code="engine_error")


async def _wait_for_disconnect(receive: Receive, on_disconnect: Callable[[], None]) -> None:
    while True:
        message: Message = await receive()
        if message["type"] == "http.disconnect":
            on_disconnect()
            return


class _EventStream(StreamingResponse):
    """Server-sent events; a client that goes away cancels the request at once, even mid-wait."""

    def __init__(self, frames: AsyncIterator[bytes], on_disconnect: Callable[[], None]) -> None:
        super().__init__(
            frames,
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
        self._frames = frames
        self._on_disconnect = on_disconnect

    async def __call__(self, _scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        watcher = asyncio.create_task(_wait_for_disconnect(receive, self._on_disconnect))
        try:
            async for frame in self._frames:
                await send({"type": "http.response.body", "body": frame, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:  # uvicorn's ClientDisconnected on a write after the peer left
            pass
        finally:
            # A no-op once the request has finished; otherwise (disconnect, task cancelled) it stops it.
            self._on_disconnect()
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


async def _stream(ticket: Ticket, render: Renderer) -> AsyncIterator[bytes]:
    if render.kind == "chat":
        yield sse(render.chunk(None))
    while True:
        event = await ticket.next_event()
        if isinstance(event, TextDelta):
            yield sse(render.chunk(event.text))
        elif isinstance(event, Finished):
            if event.reason == "cancelled":
                return
            yield sse(render.chunk("", event.reason))
            if render.include_usage:
                yield sse(render.usage_chunk(event.usage))
            yield SSE_DONE
            return
        else:
            yield sse(_failure(event).body())
            yield SSE_DONE
            return


async def _collect(ticket: Ticket, render: Renderer, receive: Receive) -> Response:
    watcher = asyncio.create_task(_wait_for_disconnect(receive, ticket.cancel))
    parts: list[str] = []
    try:
        while True:
            event = await ticket.next_event()
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, Failed):
                return _error(_failure(event))
            elif event.reason == "cancelled":
                return Response(status_code=499)
            else:
                return JSONResponse(render.completion("".join(parts), event.reason, event.usage))
    finally:
        ticket.cancel()  # a no-op once finished; stops the request if this task was cancelled
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


@dataclass(frozen=True)
class WorkerApp:
    """The ASGI app and its shutdown hook (`begin_shutdown` is safe to call from a signal handler)."""

    asgi: Starlette
    begin_shutdown: Callable[[], None]


def create_app(spec: WorkerSpec, on_fatal: Callable[[str], None]) -> WorkerApp:
    """The worker's ASGI app; the model loads on a thread started by the lifespan."""
    state = _WorkerState(spec, on_fatal)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        state.loop = asyncio.get_running_loop()
        loader = threading.Thread(target=state.load, name="model-loader", daemon=True)
        loader.start()
        try:
            yield
        finally:
            await asyncio.to_thread(loader.join)
            await asyncio.to_thread(state.close)

    async def health(_request: Request) -> Response:
        engine = state.engine
        if engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        stats = asdict(engine.scheduler.stats())
        return JSONResponse(
            {
                "status": "ok",
                "model": spec.model_name,
                "n_ctx_per_slot": spec.context.n_ctx_per_seq,
                "kv_cells_total": spec.context.n_ctx_per_seq * spec.context.n_seq_max,
                **stats,
            }
        )

    async def models(_request: Request) -> Response:
        # Like LMDeploy's api_server (which only listens once its engine is loaded), the model list is only
        # offered once the model can be served: readiness checks (the LMDeploy adapter, remote sources) use it.
        if state.engine is None:
            return _error(WireError(503, "the model is still loading", type="server_error", code="worker_loading"))
        model = {"id": spec.model_name, "object": "model", "created": state.created, "owned_by": "voltgate"}
        return JSONResponse({"object": "list", "data": [model]})

    async def generate(request: Request, kind: Kind) -> Response:
        engine = state.engine
        if engine is None:
            return _error(WireError(503, "the model is still loading", type="server_error", code="worker_loading"))
        try:
            raw = await request.body()
            try:
                body = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as exc:
                raise WireError(400, f"invalid JSON body: {exc}") from exc
            parsed = parse_request(kind, body)
            try:
                prompt = await asyncio.to_thread(engine.encode, parsed)
            except ChatTemplateError as exc:
                raise WireError(400, str(exc), param="messages") from exc
            limit = spec.context.n_ctx_per_seq
            if len(prompt) >= limit:
                raise WireError(
                    400,
                    f"this model's context is {limit} tokens per request, but the prompt has {len(prompt)}",
                    param="messages" if kind == "chat" else "prompt",
                    code="context_length_exceeded",
                )
            render = Renderer(kind, new_id(kind), int(time.time()), spec.model_name, parsed.include_usage)
            generation = GenerationRequest(
                request_id=render.id,
                prompt=tuple(prompt),
                sampling=parsed.sampling,
                max_tokens=parsed.max_tokens,
                stop=parsed.stop,
            )
            try:
                ticket = engine.scheduler.submit(generation, asyncio.get_running_loop())
            except QueueFullError as exc:
                raise WireError(429, str(exc), type="rate_limit_error", code="queue_full") from exc
            except SchedulerClosedError as exc:
                raise WireError(503, str(exc), type="server_error", code="worker_unavailable") from exc
        except WireError as exc:
            return _error(exc)
        if parsed.stream:
            return _EventStream(_stream(ticket, render), ticket.cancel)
        return await _collect(ticket, render, request.receive)

    def endpoint(kind: Kind) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            return await generate(request, kind)

        return handle

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", endpoint("chat"), methods=["POST"]),
        Route("/v1/completions", endpoint("completion"), methods=["POST"]),
    ]
    return WorkerApp(Starlette(routes=routes, lifespan=lifespan), state.begin_shutdown)
