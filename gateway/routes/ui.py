"""The status page and playground (docs/status-page.md): static files shipped in the package, and the one
JSON endpoint they read besides the public API.

    GET /               redirects to /ui
    GET /ui             the page (HTML shell: no data in it, so it loads without a key)
    GET /ui/app.js      its script; GET /ui/style.css its styles
    GET /ui/api/status  `gateway.ops.status.StatusReport` for the caller's key (401 without a valid key)

Every page response carries a strict Content-Security-Policy (only this origin; no inline script or style;
no frames), `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer`.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from gateway.errors import Envelope, ErrorCode, GatewayError
from gateway.ops.status import StatusReport, status_report
from gateway.routes.admin import admin_denial
from gateway.routes.boundary import speaking
from gateway.routes.context import app_context

router = APIRouter(route_class=speaking(Envelope.OPENAI))

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}
ASSETS = {"app.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}


def _asset(name: str) -> bytes:
    return resources.files("gateway.ui").joinpath(name).read_bytes()


@router.get("/", include_in_schema=False)
async def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> Response:
    return Response(status_code=204)  # browsers ask for one; an empty answer, not a 404 in the error log


@router.get("/ui", include_in_schema=False)
async def page() -> Response:
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8", headers=SECURITY_HEADERS)


@router.get("/ui/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise GatewayError(ErrorCode.NOT_FOUND, f"Unknown route: GET /ui/{name}")
    return Response(_asset(name), media_type=media_type, headers=SECURITY_HEADERS)


@router.get("/ui/api/status", response_model=StatusReport)
async def status(request: Request) -> JSONResponse:
    """What the status page shows (models, memory per GPU, speed history, recent errors) for this key."""
    app = app_context(request)
    principal = app.keys.authenticate(request.headers.get("authorization"), request.headers.get("x-api-key"))
    report = status_report(
        app.registry, app.service.residency, app.metrics, app.placement, principal=principal,
        admin=admin_denial(request, app, principal) is None, open_mode=app.keys.open_mode, accepting=app.accepting,
    )  # fmt: skip
    return JSONResponse(report.model_dump(mode="json"), headers={"cache-control": "no-store"})
