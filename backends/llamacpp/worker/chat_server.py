"""The worker's HTTP surface: OpenAI chat/completions over the scheduler, /health and /v1/models."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from backends.errors import ErrorCode
from backends.llamacpp.worker import replies
from backends.llamacpp.worker.checkpoints import DEFAULT_CTX_CHECKPOINTS
from backends.llamacpp.worker.choices import Choice, cancel_all
from backends.llamacpp.worker.httpkit import (
    EventStream,
    WorkerApp,
    WorkerError,
    invalid,
    loading,
    model_list,
    parse_body,
)
from backends.llamacpp.worker.native import ContextOptions, Model
from backends.llamacpp.worker.output import ChatOutput
from backends.llamacpp.worker.prompt_bound import check_prompt_bytes, longest_token_bytes
from backends.llamacpp.worker.prompt_cache import PromptCache, SavePolicy
from backends.llamacpp.worker.prompts import Prepared, PromptBuilder, PromptError
from backends.llamacpp.worker.reasoning import ReasoningStream
from backends.llamacpp.worker.scheduler import QueueFullError, Scheduler, SchedulerClosedError
from backends.llamacpp.worker.slow_lane import DEFAULT_GRAMMAR_STEP_LIMIT_S
from backends.llamacpp.worker.text import ChatTemplateError
from backends.llamacpp.worker.tickets import GenerationRequest, ImageSpan, Ticket
from backends.llamacpp.worker.vision import VisionError, VisionProjector
from backends.llamacpp.worker.wire import Kind, Renderer, logit_bias, new_id, sampling_params
from backends.overflow import overflow_message
from backends.request import EngineRequest

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
    prompt_cache_mib: int = 0
    """Host memory for KV states of overwritten slots (`prompt_cache`); 0 = off."""
    save_policy: SavePolicy = field(default_factory=SavePolicy)
    """Which slot states are worth that copy (`prompt_cache.SavePolicy`)."""
    ctx_checkpoints: int = DEFAULT_CTX_CHECKPOINTS
    """Context checkpoints per slot, for a recurrent or hybrid model only (`checkpoints`); 0 = off."""
    grammar_step_limit_s: float = DEFAULT_GRAMMAR_STEP_LIMIT_S
    """The longest one token of a heavy grammar may take (`slow_lane`)."""
    mmproj: Path | None = None
    """The multimodal projector GGUF: with one, requests may carry images."""


MAX_GRAMMAR_BYTES = 2**20
"""The largest grammar (GBNF text) a request may need: a 20,000-value enum's is ~0.5 MiB (`slow_lane`)."""


class _Engine:
    """The loaded model with its prompt builder (chat template, tool format) and scheduler."""

    def __init__(self, spec: WorkerSpec, on_fatal: Callable[[str], None]) -> None:
        self.model = Model(spec.model_path, spec.context)
        self._n_batch = spec.context.n_batch
        try:
            self.projector = _load_projector(spec, self.model)
        except Exception:
            self.model.close()
            raise
        self.prompts = PromptBuilder(self.model, self.projector)
        self.longest_token = longest_token_bytes(self.model)  # the prompt byte bound's divisor (prompt_bound)
        self.scheduler = Scheduler(
            self.model,
            slots=spec.context.n_seq_max,
            n_ctx_per_slot=spec.context.n_ctx_per_seq,
            n_batch=spec.context.n_batch,
            max_queue=spec.max_queue,
            fill_gaps=spec.fill_gaps,
            sampling_threads=spec.sampling_threads,
            on_fatal=on_fatal,
            images=self._eval_image if self.projector is not None else None,
            prompt_cache=PromptCache(spec.prompt_cache_mib * 2**20),
            save_policy=spec.save_policy,
            ctx_checkpoints=spec.ctx_checkpoints,
            grammar_step_limit_s=spec.grammar_step_limit_s,
        )
        self.scheduler.start()

    def _eval_image(self, image: ImageSpan, seq_id: int, n_past: int) -> int:
        """The scheduler's image evaluator (engine thread): mtmd encodes the image, decodes it into `seq_id`."""
        assert self.projector is not None
        context = self.model.context
        return self.projector.eval_image(image.chunk, context, seq_id=seq_id, n_past=n_past, n_batch=self._n_batch)

    def close(self) -> None:
        self.scheduler.stop()
        if self.projector is not None:
            self.projector.close()
        self.model.close()


def _load_projector(spec: WorkerSpec, model: Model) -> VisionProjector | None:
    """The `--mmproj` projector for `model`; a projector that does not load fails the worker's start."""
    if spec.mmproj is None:
        return None
    context = spec.context
    projector = VisionProjector.load(
        spec.mmproj, model.raw_model, n_threads=context.n_threads or 2, use_gpu=context.n_gpu_layers != 0
    )
    if projector.uses_mrope:  # positions would advance by n_pos, not n_tokens: the slots count tokens
        projector.close()
        raise VisionError(f"{spec.mmproj}: projectors with M-RoPE positions (Qwen-VL) are not served yet")
    return projector


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
            "loaded model %s from %s in %.1fs (slots=%d ctx/slot=%d n_batch=%d threads=%s flash_attn=%s kv=%s%s%s%s%s"
            " longest_token=%dB)",
            self.spec.model_name,
            self.spec.model_path,
            time.monotonic() - started,
            ctx.n_seq_max,
            ctx.n_ctx_per_seq,
            ctx.n_batch,
            ctx.n_threads or "llama.cpp's",
            ctx.flash_attn,
            ctx.cache_type,
            " unified" if ctx.kv_unified else "",
            f" mmproj={self.spec.mmproj}" if self.spec.mmproj else "",
            " fill_gaps" if self.spec.fill_gaps else "",
            f" sampling_threads={self.spec.sampling_threads}" if self.spec.sampling_threads > 1 else "",
            engine.longest_token,
        )

    def close(self) -> None:
        with self._lock:
            self._closing = True
            engine, self.engine = self.engine, None
        if engine is not None:
            engine.close()


def _validate(raw: bytes, kind: Kind) -> EngineRequest:
    """The body as the one engine request type the gateway built it with."""
    request = parse_body(raw, EngineRequest)
    if request.is_chat != (kind == "chat"):
        expected = "messages" if kind == "chat" else "prompt"
        raise invalid(f"this endpoint takes '{expected}'", param=expected)
    return request


def _check_length(prepared: Prepared, limit: int, kind: Kind) -> None:
    if len(prepared.tokens) >= limit:
        field = "messages" if kind == "chat" else "prompt"
        raise WorkerError(
            ErrorCode.CONTEXT_LENGTH_EXCEEDED, overflow_message(limit, len(prepared.tokens), field=field), param=field
        )


def _submit(engine: _Engine, request: EngineRequest, prepared: Prepared, request_id: str) -> list[Ticket]:
    """One generation per choice, submitted as a group that shares the prompt (and its KV)."""
    bias = logit_bias(request, engine.model.n_vocab)
    top = (request.top_logprobs or 0) if request.logprobs else None
    generations = [
        GenerationRequest(
            request_id=request_id if request.n == 1 else f"{request_id}/{i}",
            prompt=tuple(prepared.tokens),
            sampling=replace(
                sampling_params(request, prepared.grammar, choice=i),
                logit_bias=bias,
                grammar_triggers=prepared.grammar_triggers,
            ),
            max_tokens=request.max_tokens,
            stop=() if prepared.reasoning.enabled else request.stop,  # matched on the answer: `ChatOutput`
            logprobs=top,
            shown_specials=prepared.shown_specials,
            images=prepared.images,
            report_start=i == 0 and request.stream and request.include_prompt_usage,
            session_key=request.session_key,
            thinking_budget=prepared.thinking_budget,
        )
        for i in range(request.n)
    ]
    try:
        return engine.scheduler.submit_group(generations, asyncio.get_running_loop())
    except QueueFullError as exc:
        raise WorkerError(ErrorCode.QUEUE_FULL, str(exc)) from exc
    except SchedulerClosedError as exc:
        raise WorkerError(ErrorCode.WORKER_UNAVAILABLE, str(exc)) from exc


class _Routes:
    """The worker's HTTP handlers over one `_WorkerState`."""

    def __init__(self, state: _WorkerState) -> None:
        self.state = state
        self.spec = state.spec

    async def health(self, _request: Request) -> Response:
        engine = self.state.engine
        if engine is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        context = self.spec.context
        return JSONResponse(
            {
                "status": "ok",
                "model": self.spec.model_name,
                "n_ctx_per_slot": context.n_ctx_per_seq,
                "kv_cells_total": context.n_ctx_per_seq * context.n_seq_max,
                "vision": engine.projector is not None,
                "reasoning_format": engine.prompts.reasoning.format,
                **asdict(engine.scheduler.stats()),
            }
        )

    async def models(self, _request: Request) -> Response:
        # Like LMDeploy's api_server (which only listens once its engine is loaded), the model list is only
        # offered once the model can be served: readiness checks (the LMDeploy adapter, remote sources) use it.
        if self.state.engine is None:
            return loading().response()
        return model_list(self.spec.model_name, self.state.created, self.state.engine.prompts.reasoning.format)

    async def chat(self, request: Request) -> Response:
        return await self.generate(request, "chat")

    async def completion(self, request: Request) -> Response:
        return await self.generate(request, "completion")

    async def generate(self, request: Request, kind: Kind) -> Response:
        engine = self.state.engine
        if engine is None:
            return loading().response()
        try:
            engine_request = _validate(await request.body(), kind)
            check_prompt_bytes(engine_request, engine.longest_token, self.spec.context.n_ctx_per_seq)
            prepared = await _prepare(engine, engine_request)
            _check_length(prepared, self.spec.context.n_ctx_per_seq, kind)
            request_id = new_id(kind)
            tickets = _submit(engine, engine_request, prepared, request_id)
        except WorkerError as exc:
            return exc.response()
        render = Renderer(kind, request_id, int(time.time()), self.spec.model_name)
        lp = engine_request.logprobs
        choices = [Choice(i, t, _output(engine_request, prepared), lp) for i, t in enumerate(tickets)]
        if engine_request.stream:
            frames = replies.stream(choices, render, engine_request.include_usage, engine_request.include_prompt_usage)
            return EventStream(frames, lambda: cancel_all(choices))
        return await replies.collect(choices, render, request.receive)


def _output(request: EngineRequest, prepared: Prepared) -> ChatOutput:
    """One choice's output: tool calls, and with a reasoning syntax the thinking split off (a completion
    request's text is never split: it has no template)."""
    if not prepared.reasoning.enabled or not request.is_chat:
        return ChatOutput(prepared.tool_format, prepared.tool_names, forced=prepared.forced_call)
    thinking = ReasoningStream(prepared.reasoning, prepared.reasoning_start)
    return ChatOutput(
        prepared.tool_format, prepared.tool_names, forced=prepared.forced_call, reasoning=thinking, stops=request.stop
    )


async def _prepare(engine: _Engine, request: EngineRequest) -> Prepared:
    """Prompt tokens and grammar, off the event loop; a template or schema that refuses is a 400, and so is a
    grammar over `MAX_GRAMMAR_BYTES` (a schema's 40,000-value enum: ~10 s a token even off the step)."""
    try:
        prepared = await asyncio.to_thread(engine.prompts.prepare, request)
    except ChatTemplateError as exc:
        raise invalid(str(exc), param="messages") from exc
    except PromptError as exc:
        raise invalid(str(exc), param=exc.param) from exc
    size = len(prepared.grammar or "")
    if size > MAX_GRAMMAR_BYTES:
        param = "response_format" if prepared.tool_format is None else "tools"
        raise invalid(
            f"the grammar that enforces {param} is {size / 2**20:.1f} MiB, over the {MAX_GRAMMAR_BYTES // 2**20} "
            "MiB this worker builds (a JSON schema's enum or anyOf that large samples too slowly to serve)",
            param=param,
        )
    return prepared


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

    handlers = _Routes(state)
    routes = [
        Route("/health", handlers.health, methods=["GET"]),
        Route("/v1/models", handlers.models, methods=["GET"]),
        Route("/v1/chat/completions", handlers.chat, methods=["POST"]),
        Route("/v1/completions", handlers.completion, methods=["POST"]),
    ]
    return WorkerApp(Starlette(routes=routes, lifespan=lifespan), state.begin_shutdown)
