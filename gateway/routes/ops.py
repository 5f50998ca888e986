"""Operations endpoints: /health (process alive), /ready (every worker ready), /metrics, /v1/placement (the
plan, each model's predicted speed beside its measured one)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from gateway.errors import Envelope
from gateway.lifecycle.deployments import Deployment
from gateway.lifecycle.workers import WorkerState
from gateway.ops.live_speed import placement_with_measured
from gateway.routes.boundary import speaking
from gateway.routes.context import AppContext, app_context

router = APIRouter(route_class=speaking(Envelope.OPENAI))


@router.get("/health")
async def health() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    app = app_context(request)
    models = {
        d.name: {
            "state": d.worker.state.value,
            "engine": d.plan.engine.value,
            "restarts": d.worker.restarts,
            "running": d.admission.running,
            "waiting": d.admission.waiting,
            "load": d.load,
            "status": app.service.residency.state(d).value,
            **({"error": d.worker.last_error} if d.worker.last_error else {}),
        }
        for d in app.registry
    }
    # An on-demand model is loaded by its first request: being unloaded does not make the gateway unready.
    pinned = {d.name for d in app.registry if d.load == "always"}
    not_ready = sorted(n for n, m in models.items() if n in pinned and m["state"] != WorkerState.READY.value)
    refused = dict(app.registry.refused)
    ok = not not_ready and not refused and app.accepting
    body: dict[str, object] = {
        "status": "ready" if ok else "not_ready",
        "models": models,
        "not_ready": not_ready + sorted(refused),
    }
    if refused:
        body["refused"] = refused
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    app = app_context(request)
    return Response(app.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")


@router.get("/v1/placement")
async def placement(request: Request) -> JSONResponse:
    app = app_context(request)
    app.keys.authenticate(request.headers.get("authorization"))
    served = {d.name for d in app.registry}
    body = placement_with_measured(app.placement, app.metrics.live, served)
    live = {d.name: _live_state(app, d) for d in app.registry}
    for decision in body.get("decisions") or ():
        if isinstance(decision, dict) and decision.get("model") in live:
            decision["live"] = live[decision["model"]]  # the model's state now; a failed one says why
    return JSONResponse(body)


def _live_state(app: AppContext, deployment: Deployment) -> dict[str, str | None]:
    residency = app.service.residency
    return {"status": residency.state(deployment).value, "error": residency.failure(deployment)}
