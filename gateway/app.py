"""create_app(config, placement) -> FastAPI. The lifespan owns the httpx client, the workers and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from backends.base import DeploymentPlan, EngineAdapter, EngineName
from backends.llamacpp import LlamaCppAdapter
from backends.lmdeploy import LMDeployAdapter
from backends.remote import RemoteAdapter
from gateway import __version__
from gateway.admission import Admission
from gateway.config import Config, ModelSpec
from gateway.errors import GatewayError, Render
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.policy import policy_for
from gateway.lifecycle.process import WorkerProcess
from gateway.lifecycle.remote import RemoteHandle
from gateway.lifecycle.residency import Residency
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import Worker, WorkerHandle, WorkerState
from gateway.openapi import install_openapi
from gateway.ops.auth import KeyStore
from gateway.ops.live_speed import predictions_from_placement
from gateway.ops.metrics import Metrics
from gateway.ops.store import ResponseStore
from gateway.reload import Desired, Planner, Reloader
from gateway.routes import admin, inference, messages, models, ops, responses, ui
from gateway.routes.boundary import ErrorBoundary
from gateway.routes.context import AppContext
from gateway.routes.direct import DirectDispatch
from gateway.serving.browser import BrowserGuardMiddleware
from gateway.serving.middleware import RequestBodyMiddleware, RequestEdgeMiddleware
from gateway.serving.service import Service
from gateway.serving.vision_parts import ImageIntake

if TYPE_CHECKING:
    from gateway.cluster.serve import ClusterServing

log = logging.getLogger("voltgate")

STATS_INTERVAL_S = 2.0
ROUTERS = tuple(module.router for module in (inference, responses, messages, models, ops, admin, ui))
"""Every router of the gateway; each declares its error envelope (`gateway.routes.boundary.speaking`)."""


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
    planner: Planner | None = None,
    watch: Path | None = None,
    cluster: ClusterServing | None = None,
) -> FastAPI:
    """The gateway for placed deployments (workers start in the lifespan); `planner` re-places on reloads."""
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

            def make(plan: DeploymentPlan, spec: ModelSpec) -> Deployment:
                return _deployment(
                    plan, spec, adapters[plan.engine], client, config, metrics, residency.on_worker_state, cluster
                )

            for plan in plans:
                registry.add(make(plan, specs[plan.model]))
            service = Service(registry, client, config.server, metrics, residency, ImageIntake(config.images),
                              prompt_cache=config.prompt_cache)  # fmt: skip
            store = ResponseStore(config.data_path(), max_age_s=config.server.responses_max_age_s,
                                  max_rows=config.server.responses_max_rows)  # fmt: skip
            context = AppContext(config, registry, service, metrics, keys, placement=placement or {}, store=store)
            app.state.voltgate = context
            _announce(config, keys, registry)
            await residency.start()  # pinned models load now, on-demand ones at their first request
            stats = asyncio.create_task(_poll_worker_stats(registry, client, metrics))
            if cluster is not None:  # host loss and rejoin: gateway.cluster.serve
                cluster.start(registry, residency, make, metrics, lambda p: setattr(context, "placement", p))
            current = Desired(config, tuple(plans), dict(refused or {}), placement or {})
            context.reloader = _reloader(context, planner, current, residency, make, watch) if planner else None
            try:
                yield
            finally:
                context.accepting = False
                stats.cancel()
                if cluster is not None:
                    await cluster.close()
                if context.reloader is not None:
                    await context.reloader.close()
                log.info("stopping %d worker(s)", len(registry.deployments))
                await residency.close()
                store.close()

    return _fastapi(lifespan, config, metrics)


class GatewayApp(FastAPI):
    """FastAPI, with the fixed-path inference endpoints dispatched ahead of its own stack (`DirectDispatch`)
    and the gateway's middlewares (`edges`) around both."""

    edges: Callable[[ASGIApp], ASGIApp] = staticmethod(lambda app: app)
    direct_routes: Sequence[BaseRoute] = ()
    boundary: Render

    def build_middleware_stack(self) -> ASGIApp:
        fastapi_stack = super().build_middleware_stack()
        if isinstance(fastapi_stack, ServerErrorMiddleware):  # the gateway's error boundary answers a bug, in the
            fastapi_stack = fastapi_stack.app  # route's API shape (Starlette's would answer first, in plain text)
        return self.edges(DirectDispatch(fastapi_stack, self.direct_routes, self.boundary))


def _fastapi(lifespan: Callable[[FastAPI], Any], config: Config, metrics: Metrics) -> FastAPI:
    app = GatewayApp(
        title="voltgate",
        version=__version__,
        description="OpenAI-compatible gateway for V100 GPUs (LMDeploy TurboMind FP16 and llama.cpp GGUF).",
        lifespan=lifespan,
    )
    for router in ROUTERS:
        app.include_router(router)
    app.direct_routes = [route for router in (inference, responses, messages) for route in router.router.routes]
    routes = [route for router in ROUTERS for route in router.routes]
    boundary = app.boundary = ErrorBoundary(routes, namespaces=messages.NAMESPACES)
    boundary.install(app)
    install_openapi(app)
    app.edges = lambda inner: _edges(inner, config, metrics, boundary)
    return app


def _reloader(
    context: AppContext, planner: Planner, current: Desired, residency: Residency,
    make: Callable[[DeploymentPlan, ModelSpec], Deployment], watch: Path | None,
) -> Reloader:  # fmt: skip
    """Config reloads: SIGHUP, the admin route, and the file watcher when asked for."""

    def applied(desired: Desired) -> None:
        context.placement = desired.placement
        context.metrics.set_predictions(predictions_from_placement(desired.placement, {p.model for p in desired.plans}))

    reloader = Reloader(planner, current, context.registry, residency, make, on_applied=applied)
    with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread / on Windows
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reloader.on_sighup)
    if watch is not None:
        reloader.watch(watch)
    return reloader


def _announce(config: Config, keys: KeyStore, registry: Registry) -> None:
    """What an operator must see at start: open mode, and every model that is not served."""
    if keys.open_mode:
        log.warning(
            "OPEN MODE: no API keys configured, anyone who can reach %s:%s can use every model",
            config.server.host, config.server.port,
        )  # fmt: skip
    for name, reason in registry.refused.items():
        log.error("model %s not served: %s", name, reason)


def _edges(app: ASGIApp, config: Config, metrics: Metrics, render: Render) -> ASGIApp:
    """The gateway's middlewares, outermost last: request id, error boundary and accounting → CORS → browser
    guard (JSON bodies, foreign origins) → body size and time → `app`; each renders its errors with `render`."""
    app = RequestBodyMiddleware(
        app, max_bytes=config.server.max_body_bytes, timeout_s=config.server.body_timeout_s, render=render
    )
    app = BrowserGuardMiddleware(app, config.server.cors_origins, render=render)
    if config.server.cors_origins:  # browser frontends served from another origin
        app = CORSMiddleware(
            app,
            allow_origins=list(config.server.cors_origins),
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "openai-processing-ms", "retry-after"],
        )
    return RequestEdgeMiddleware(app, metrics=metrics, render=render)


def _deployment(
    plan: DeploymentPlan,
    spec: ModelSpec,
    adapter: EngineAdapter,
    client: httpx.AsyncClient,
    config: Config,
    metrics: Metrics,
    on_worker_state: Callable[[str, WorkerState], None] | None = None,
    cluster: ClusterServing | None = None,
) -> Deployment:
    states = [s.value for s in WorkerState]

    def on_state(name: str, state: WorkerState) -> None:
        metrics.set_worker_state(name, plan.engine.value, state.value, states)
        if state is WorkerState.FAILED:
            metrics.worker_restarts.labels(name).inc()
        if on_worker_state is not None:
            on_worker_state(name, state)

    worker: Worker | None = cluster.worker_for(plan, on_state) if cluster is not None else None
    if worker is None:  # else on a cluster host (gateway.cluster.serve)
        handle: WorkerHandle = (
            RemoteHandle(plan.model, plan.remote_url, client=client) if plan.remote_url is not None
            else WorkerProcess(plan.model, lambda port: adapter.launch_spec(plan, port), client=client,
                               frozen_after_s=config.server.worker_frozen_s)
        )  # fmt: skip
        worker = WorkerMachine(
            handle, policy_for(spec.load, spec.idle_unload_s, remote=plan.remote_url is not None), on_state=on_state,
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
        sampling=spec.sampling.model_dump(exclude_none=True),
        load=spec.load, idle_unload_s=spec.idle_unload_s, alias_patterns=spec.alias_patterns,
        reasoning=spec.reasoning,
    )  # fmt: skip


async def _poll_worker_stats(registry: Registry, client: httpx.AsyncClient, metrics: Metrics) -> None:
    while True:
        await asyncio.sleep(STATS_INTERVAL_S)
        for deployment in registry:
            if deployment.worker.state is not WorkerState.READY or deployment.plan.engine is not EngineName.LLAMACPP:
                continue
            with contextlib.suppress(httpx.HTTPError, ValueError, GatewayError):
                response = await client.get(
                    deployment.worker.base_url() + "/health", timeout=2.0, headers=deployment.worker.headers
                )
                data = response.json()
                if isinstance(data, dict):
                    metrics.update_worker_stats(deployment.name, data)
