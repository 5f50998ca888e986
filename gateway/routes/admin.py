"""The admin API: which models are in memory, and loading or unloading one by hand.

    GET  /admin/models                 every model's state, memory (estimated, measured), last use, requests
    POST /admin/models/{name}/load     load it now (waits for the load; a remembered failure is retried)
    POST /admin/models/{name}/unload   unload it now (drains requests in flight up to server.drain_timeout_s)
    POST /admin/reload                 re-read the config file and apply its model changes (gateway.reload)

Who may call it: a key with `scopes: [admin]`. In open mode (no keys configured) only clients connecting
from a loopback address, so a gateway bound to a LAN address without keys cannot be steered by anyone
who can reach it; behind a reverse proxy on the same host every client looks local, so configure keys.
"""

from __future__ import annotations

import ipaddress

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from gateway.errors import ErrorCode, GatewayError
from gateway.ops.auth import Principal
from gateway.routes.context import AppContext, app_context

router = APIRouter(prefix="/admin")

ADMIN_SCOPE = "admin"


def _is_loopback(host: str | None) -> bool:
    if host is None:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def admin_denial(request: Request, app: AppContext, principal: Principal) -> str | None:
    """Why this caller (already authenticated as `principal`) may not use the admin API; None if it may."""
    if app.keys.open_mode:
        if not _is_loopback(request.client.host if request.client else None):
            return "the admin API answers only loopback clients in open mode; configure a key with scopes: [admin]"
    elif ADMIN_SCOPE not in principal.scopes:
        return f"key {principal.key_id!r} lacks the admin scope"
    return None


def authorize_admin(request: Request) -> AppContext:
    """The app context for an admin call; 401 without a valid key, 403 without the admin scope."""
    app = app_context(request)
    principal = app.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    denial = admin_denial(request, app, principal)
    if denial is not None:
        raise GatewayError(ErrorCode.PERMISSION_DENIED, denial)
    return app


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    app = authorize_admin(request)
    residency = app.service.residency
    models = [residency.describe(d) for d in app.registry]
    refused = [{"model": name, "state": "refused", "error": why} for name, why in sorted(app.registry.refused.items())]
    return JSONResponse({"object": "list", "data": models + refused, "memory": residency.budgets()})


@router.post("/models/{name:path}/load")
async def load_model(name: str, request: Request) -> JSONResponse:
    app = authorize_admin(request)
    app.check_accepting()
    deployment = app.registry.resolve(name)
    await app.service.residency.load(deployment)
    return JSONResponse(app.service.residency.describe(deployment))


@router.post("/models/{name:path}/unload")
async def unload_model(name: str, request: Request) -> JSONResponse:
    app = authorize_admin(request)
    deployment = app.registry.resolve(name)
    await app.service.residency.unload(deployment)
    return JSONResponse(app.service.residency.describe(deployment))


@router.post("/reload")
async def reload_config(request: Request) -> JSONResponse:
    """Added models placed and started, removed ones drained and stopped, changed ones restarted; a config
    that does not load is refused (400) with the reason and the running one stays."""
    app = authorize_admin(request)
    app.check_accepting()
    if app.reloader is None:
        raise GatewayError(ErrorCode.INVALID_REQUEST, "this gateway was started without a config file to re-read")
    result = await app.reloader.reload()
    return JSONResponse(result.to_json())
