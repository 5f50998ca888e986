"""GET /v1/models and /v1/models/{id}."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from gateway.errors import Envelope, ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment
from gateway.protocol import Model, ModelList
from gateway.routes.boundary import speaking
from gateway.routes.context import AppContext, app_context

router = APIRouter(route_class=speaking(Envelope.OPENAI))


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    app = app_context(request)
    principal = app.keys.authenticate(request.headers.get("authorization"))
    data = [
        _with_status(app, d)
        for d in app.registry
        if d.replica_of is None  # a model once, not once per replica
        and (not principal.models or d.name in principal.models or set(d.aliases) & set(principal.models))
    ]
    return JSONResponse({**ModelList().model_dump(mode="json"), "data": data})


@router.get("/v1/models/{model_id:path}")
async def get_model(model_id: str, request: Request) -> JSONResponse:
    app = app_context(request)
    principal = app.keys.authenticate(request.headers.get("authorization"))
    deployment = app.registry.resolve(model_id)
    try:
        principal.check_model(deployment.name, deployment.aliases)
    except GatewayError:
        raise GatewayError(ErrorCode.MODEL_NOT_FOUND, f"The model {model_id!r} does not exist", param="model") from None
    return JSONResponse(_with_status(app, deployment))


def _with_status(app: AppContext, deployment: Deployment) -> dict[str, Any]:
    """The entry with the extension field `status` (unloaded, loading, ready, draining or failed) and, for a
    failed model, `status_reason` (why: a crash loop names its signal)."""
    residency = app.service.residency
    entry = {**_model(deployment).model_dump(mode="json"), "status": residency.state(deployment).value}
    reason = residency.failure(deployment)
    if reason is not None:
        entry["status_reason"] = reason
    return entry


def _model(deployment: Deployment) -> Model:
    """An OpenAI model entry plus voltgate's extension fields: the engine, what the model can do, its task, the
    other names that reach it and, for a generating model, its reasoning default (effort and budget: null is the
    chat template's own). An alias pattern is not an entry of its own: a client that lists models offers and
    sends their ids, and `claude-*` is no name to send (LiteLLM's `*` entry is a reported bug, #13643)."""
    reasoning = deployment.reasoning.model_dump(mode="json")
    return Model(
        id=deployment.name,
        created=deployment.created,
        engine=deployment.plan.engine.value,
        capabilities=deployment.capabilities.public(),
        task=deployment.plan.task,
        aliases=list(deployment.aliases),
        alias_patterns=list(deployment.alias_patterns),
        reasoning=reasoning if deployment.plan.task == "generate" else None,
    )
