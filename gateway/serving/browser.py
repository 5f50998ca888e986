"""What a web page from another origin may make the gateway do: nothing it did not ask for.

A browser sends a "simple" cross-origin request (a form POST, a `no-cors` fetch: `text/plain`, form or
multipart bodies, no custom headers) without asking the server first, and the server acts on it even though
the page cannot read the answer. In open mode that would let any page a user visits load models, reload the
config or run chats on the gateway. Two rules close it, in `BrowserGuardMiddleware`:

- a POST carrying a body must declare it as JSON (`application/json`, or any `+json` type): anything else is
  a `415 unsupported_media_type` before the body is read. A page can send JSON cross-origin only after a
  CORS preflight, which the gateway answers only for `server.cors_origins`. Every client the gateway serves
  (the OpenAI and Anthropic SDKs, Codex, Claude Code, Open WebUI's backend) sends `application/json`
  (tests/fixtures/clients/).
- a request whose `Origin` is another site's is a `403 permission_denied`: always on `/admin/*`, and on every
  other route unless that origin is in `server.cors_origins` (or it holds `*`). The gateway's own pages
  (`/ui`) are same-origin: their `Origin` names the `Host` they were served from (or `X-Forwarded-Host`,
  set by a reverse proxy; a page cannot set it on a simple request). Clients outside a browser send no
  `Origin` and are not affected.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ErrorCode, GatewayError, Render

_DEFAULT_PORTS = {"http": 80, "https": 443}


def is_json(content_type: str) -> bool:
    """Whether a `Content-Type` header value declares JSON (`application/json`, `application/x+json`)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def _authority(netloc: str, scheme: str) -> tuple[str, int] | None:
    """(host, port) of a `host[:port]`, lower-case, the scheme's default port written out (an `Origin` omits
    it, a `Host` may not); None when it does not parse."""
    try:
        parts = urlsplit(f"//{netloc.strip()}")
        port = parts.port
    except ValueError:
        return None
    return (parts.hostname, port or _DEFAULT_PORTS[scheme]) if parts.hostname else None


def same_origin(origin: str, hosts: Sequence[str]) -> bool:
    """Whether `origin` (an `Origin` header) names one of `hosts` (the request's `Host`, `X-Forwarded-Host`)."""
    parts = urlsplit(origin)
    if parts.scheme not in _DEFAULT_PORTS or not parts.netloc:
        return False  # "null" (sandboxed frames, file: pages) and anything else is foreign
    theirs = _authority(parts.netloc, parts.scheme)
    return theirs is not None and any(theirs == _authority(host, parts.scheme) for host in hosts if host)


class BrowserGuardMiddleware:
    """Refuse non-JSON POST bodies (415) and foreign origins (403), in the route's API shape (`render`);
    `cors_origins` are the origins allowed on the API (never on `/admin/*`). See the module docstring."""

    def __init__(self, app: ASGIApp, cors_origins: Sequence[str], render: Render) -> None:
        self.app = app
        self.cors_origins = frozenset(o.rstrip("/") for o in cors_origins)
        self.render = render

    def _refusal(self, scope: Scope) -> GatewayError | None:
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in _READ}
        origin = headers.get("origin")
        if origin is not None and not same_origin(
            origin, (headers.get("host", ""), headers.get("x-forwarded-host", ""))
        ):
            return self._foreign(str(scope.get("path", "")), origin)
        has_body = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")
        if scope["method"] == "POST" and has_body and not is_json(headers.get("content-type", "")):
            given = headers.get("content-type", "")[:100] or "none"
            message = f"request body must be JSON: send Content-Type: application/json (got {given})"
            return GatewayError(ErrorCode.UNSUPPORTED_MEDIA_TYPE, message)
        return None

    def _foreign(self, path: str, origin: str) -> GatewayError | None:
        """A request from another site's page: refused on the admin API, else unless CORS allows it."""
        admin = path == "/admin" or path.startswith("/admin/")
        if not admin and ("*" in self.cors_origins or origin.rstrip("/") in self.cors_origins):
            return None
        where, hint = ("the admin API", "") if admin else ("this gateway", " (allow it in server.cors_origins)")
        message = f"cross-origin requests from {origin[:200]} to {where} are refused{hint}"
        return GatewayError(ErrorCode.PERMISSION_DENIED, message)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = self._refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        await self.render(scope, refusal)(scope, receive, send)


_READ = frozenset({b"origin", b"host", b"x-forwarded-host", b"content-type", b"content-length", b"transfer-encoding"})
