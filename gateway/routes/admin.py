"""The admin API: which models are in memory, and loading or unloading one by hand.

    GET  /admin/models                 every model's state, memory (estimated, measured), last use, requests
    POST /admin/models/{name}/load     load it now (waits for the load; a remembered failure is retried)
    POST /admin/models/{name}/unload   unload it now (drains requests in flight up to server.drain_timeout_s)
    POST /admin/reload                 re-read the config file and apply its model changes (gateway.reload)

Every call that changes something (load, unload, reload) gets one line on the `voltgate.audit` logger, JSON:
who (the key's id, or in open mode the client's address), what (`action`, `model`), and the result (the
status, and the error's message on failure), refusals included.

Who may call it: a key with `scopes: [admin]`. In open mode (no keys configured) only clients connecting
from a loopback address, so a gateway bound to a LAN address without keys cannot be steered by anyone
who can reach it; behind a reverse proxy on the same host every client looks local, so configure keys.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Awaitable, Callable

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse

from gateway.errors import Envelope, ErrorCode, GatewayError
from gateway.ops.auth import ANONYMOUS, OPEN, Principal
from gateway.routes.boundary import speaking
from gateway.routes.context import AppContext, app_context
from gateway.serving.session import CONTEXT_KEY, RequestContext

router = APIRouter(prefix="/admin", route_class=speaking(Envelope.OPENAI))
audit_log = logging.getLogger("voltgate.audit")

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


def authorize_admin(request: Request) -> tuple[AppContext, Principal]:
    """The app context and caller of an admin call; 401 without a valid key, 403 without the admin scope."""
    app = app_context(request)
    principal = app.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    ctx = request.scope.get("state", {}).get(CONTEXT_KEY)
    if isinstance(ctx, RequestContext):  # its access-log line names the key
        ctx.principal = principal
    denial = admin_denial(request, app, principal)
    if denial is not None:
        raise GatewayError(ErrorCode.PERMISSION_DENIED, denial)
    return app, principal


async def audited(
    request: Request, action: str, model: str | None, act: Callable[[AppContext], Awaitable[JSONResponse]]
) -> JSONResponse:
    """Authorize an admin action, run it (`act`), and write its audit line whatever the outcome."""
    principal = ANONYMOUS
    entry: dict[str, object] = {
        "request_id": getattr(request.state, "request_id", None), "action": action, "model": model,
        "address": request.client.host if request.client else None,
    }  # fmt: skip
    try:
        app, principal = authorize_admin(request)
        response = await act(app)
    except GatewayError as exc:
        audit_log.warning(json.dumps({**entry, "who": _who(principal, request), "status": exc.status,
                                      "error": exc.message}))  # fmt: skip
        raise
    audit_log.info(json.dumps({**entry, "who": _who(principal, request), "status": response.status_code}))
    return response


def _who(principal: Principal, request: Request) -> str:
    """The key's id; in open mode (or before the key was checked) the client's address."""
    if principal.key_id not in (OPEN.key_id, ANONYMOUS.key_id):
        return principal.key_id
    return request.client.host if request.client else "unknown"


@router.get("/models")
async def list_models(request: Request) -> JSONResponse:
    app, _ = authorize_admin(request)
    residency = app.service.residency
    models = [residency.describe(d) for d in app.registry]
    refused = [{"model": name, "state": "refused", "error": why} for name, why in sorted(app.registry.refused.items())]
    return JSONResponse({"object": "list", "data": models + refused, "memory": residency.budgets()})


@router.post("/models/{name:path}/load")
async def load_model(name: str, request: Request) -> JSONResponse:
    async def load(app: AppContext) -> JSONResponse:
        app.check_accepting()
        deployment = app.registry.resolve(name)
        await app.service.residency.load(deployment)
        return JSONResponse(app.service.residency.describe(deployment))

    return await audited(request, "load", name, load)


@router.post("/models/{name:path}/unload")
async def unload_model(name: str, request: Request) -> JSONResponse:
    async def unload(app: AppContext) -> JSONResponse:
        deployment = app.registry.resolve(name)
        await app.service.residency.unload(deployment)
        return JSONResponse(app.service.residency.describe(deployment))

    return await audited(request, "unload", name, unload)


@router.post("/reload")
async def reload_config(request: Request) -> JSONResponse:
    """Added models placed and started, removed ones drained and stopped, changed ones restarted; a config
    that does not load is refused (400) with the reason and the running one stays."""

    async def reload(app: AppContext) -> JSONResponse:
        app.check_accepting()
        if app.reloader is None:
            raise GatewayError(ErrorCode.INVALID_REQUEST, "this gateway was started without a config file to re-read")
        result = await app.reloader.reload()
        return JSONResponse(result.to_json())

    return await audited(request, "reload", None, reload)
