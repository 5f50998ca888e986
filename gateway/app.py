"""create_app(config, placement) -> FastAPI. The lifespan owns the httpx client, the workers and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse

from backends.base import DeploymentPlan, EngineAdapter, EngineName
from backends.llamacpp import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from backends.remote import RemoteAdapter
from gateway import __version__
from gateway.admission import Admission
from gateway.auth import KeyStore
from gateway.config import Config, ModelSpec
from gateway.deployments import Deployment, Registry
from gateway.errors import ErrorCode, GatewayError, error_response, internal_error
from gateway.live_speed import predictions_from_placement
from gateway.metrics import Metrics
from gateway.middleware import BodyLimitMiddleware, RequestIdMiddleware
from gateway.openapi import install_openapi
from gateway.remote import RemoteEndpoint
from gateway.residency import Residency
from gateway.routes import admin, inference, messages, models, ops, responses, ui
from gateway.routes.context import AppContext
from gateway.service import Service
from gateway.store import ResponseStore
from gateway.supervisor import WorkerProcess
from gateway.workers import Worker, WorkerState

log = logging.getLogger("voltgate")

STATS_INTERVAL_S = 2.0
HTTP_STATUS_CODES = {
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    413: ErrorCode.BODY_TOO_LARGE,
}


def default_adapters(config: Config) -> dict[EngineName, EngineAdapter]:
    timeout = config.server.startup_timeout_s
    return {
        EngineName.LLAMACPP: LlamaCppAdapter(startup_timeout_s=timeout),
        EngineName.LMDEPLOY: LMDeployAdapter(startup_timeout_s=timeout),
        EngineName.REMOTE: RemoteAdapter(),
    }


def create_app(
    config: Config,
    plans: Sequence[DeploymentPlan],
    *,
    refused: Mapping[str, str] | None = None,
    placement: dict[str, Any] | None = None,
    adapters: Mapping[EngineName, EngineAdapter] | None = None,
    metrics: Metrics | None = None,
) -> FastAPI:
    """Build the gateway for already-placed deployments; workers start in the lifespan."""
    adapters = dict(adapters or default_adapters(config))
    metrics = metrics or Metrics()
    keys = KeyStore(config.auth, os.environ.get(config.auth.keys_env) if config.auth.keys_env else None)
    specs: dict[str, ModelSpec] = {m.name: m for m in config.models}
    metrics.set_predictions(predictions_from_placement(placement or {}, {plan.model for plan in plans}))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits, timeout=config.server.upstream_timeout_s) as client:
            registry = Registry(refused=dict(refused or {}))
            residency = Residency.from_placement(registry, config.server, metrics, placement or {})
            for plan in plans:
                spec, adapter = specs[plan.model], adapters[plan.engine]
                registry.add(_deployment(plan, spec, adapter, client, config, metrics, residency.on_worker_state))
            service = Service(registry, client, config.server, metrics, residency)
            store = ResponseStore(config.data_path(), max_age_s=config.server.responses_max_age_s,
                                  max_rows=config.server.responses_max_rows)  # fmt: skip
            context = AppContext(config, registry, service, metrics, keys, placement=placement or {}, store=store)
            app.state.voltgate = context
            _announce(config, keys, registry)
            await residency.start()  # pinned models load now, on-demand ones at their first request
            stats = asyncio.create_task(_poll_worker_stats(registry, client, metrics))
            try:
                yield
            finally:
                context.accepting = False
                stats.cancel()
                log.info("stopping %d worker(s)", len(registry.deployments))
                await residency.close()
                store.close()

    app = FastAPI(
        title="voltgate",
        version=__version__,
        description="OpenAI-compatible gateway for V100 GPUs (LMDeploy TurboMind FP16 and llama.cpp GGUF).",
        lifespan=lifespan,
    )
    app.include_router(inference.router)
    app.include_router(responses.router)
    app.include_router(messages.router)
    app.include_router(models.router)
    app.include_router(ops.router)
    app.include_router(admin.router)
    app.include_router(ui.router)
    _install_error_handlers(app)
    install_openapi(app)
    _install_middleware(app, config)
    return app


def _announce(config: Config, keys: KeyStore, registry: Registry) -> None:
    """What an operator must see at start: open mode, and every model that is not served."""
    if keys.open_mode:
        log.warning(
            "OPEN MODE: no API keys configured, anyone who can reach %s:%s can use every model",
            config.server.host, config.server.port,
        )  # fmt: skip
    for name, reason in registry.refused.items():
        log.error("model %s not served: %s", name, reason)


def _install_middleware(app: FastAPI, config: Config) -> None:
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.server.max_body_bytes)
    if config.server.cors_origins:  # browser frontends served from another origin
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.server.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "openai-processing-ms", "retry-after"],
        )
    app.add_middleware(RequestIdMiddleware)


def _deployment(
    plan: DeploymentPlan,
    spec: ModelSpec,
    adapter: EngineAdapter,
    client: httpx.AsyncClient,
    config: Config,
    metrics: Metrics,
    on_worker_state: Callable[[str, WorkerState], None] | None = None,
) -> Deployment:
    states = [s.value for s in WorkerState]

    def on_state(name: str, state: WorkerState) -> None:
        metrics.set_worker_state(name, plan.engine.value, state.value, states)
        if state is WorkerState.FAILED:
            metrics.worker_restarts.labels(name).inc()
        if on_worker_state is not None:
            on_worker_state(name, state)

    worker: Worker
    if plan.remote_url is not None:
        worker = RemoteEndpoint(plan.model, plan.remote_url, client=client, on_state=on_state)
    else:
        worker = WorkerProcess(
            plan.model, lambda port: adapter.launch_spec(plan, port), client=client, on_state=on_state,
            restart=spec.load == "always",  # an on-demand model's lifecycle is gateway.residency's
            on_crash=lambda name, cause: metrics.worker_crashes.labels(name, cause).inc(),
        )  # fmt: skip
    metrics.set_worker_state(plan.model, plan.engine.value, WorkerState.STOPPED.value, states)
    metrics.worker_restarts.labels(plan.model)  # exported as 0 from the start, so rate() and alerts work
    metrics.queue_depth.labels(plan.model).set(0)  # likewise: a model that never queued shows 0, not nothing
    metrics.running.labels(plan.model).set(0)
    capacity = plan.slots if plan.engine is EngineName.LLAMACPP else (plan.max_batch_size or plan.slots)
    admission = Admission(plan.model, capacity, spec.max_queue, config.server.queue_timeout_s)
    return Deployment(
        spec.name, spec.aliases, plan, adapter, worker, admission, default_max_tokens=spec.default_max_tokens,
        load=spec.load, idle_unload_s=spec.idle_unload_s,
    )  # fmt: skip


async def _poll_worker_stats(registry: Registry, client: httpx.AsyncClient, metrics: Metrics) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL_S)
        for deployment in registry:
            if deployment.worker.state is not WorkerState.READY or deployment.plan.engine is not EngineName.LLAMACPP:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError, GatewayError):
                response = await client.get(deployment.worker.base_url() + "/health", timeout=2.0)
                data = response.json()
                if isinstance(data, dict):
                    metrics.update_worker_stats(deployment.name, data)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def gateway_error(_: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_STATUS_CODES.get(exc.status_code, ErrorCode.INVALID_REQUEST)
        message = {
            404: f"Unknown route: {request.method} {request.url.path}",
            405: f"Method {request.method} not allowed for {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        return error_response(GatewayError(code, message, status=exc.status_code))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": "invalid request"}
        param = ".".join(str(p) for p in first["loc"][1:]) or None
        return error_response(GatewayError(ErrorCode.INVALID_REQUEST, str(first["msg"]), param=param))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(internal_error())
