"""The worker's per-launch secret: with `VOLTGATE_WORKER_TOKEN` set, every request must carry it as a bearer token.

A worker bound to a loopback address is reached only from its own host, and needs none. A worker another host
reaches (a cluster host agent binds it to the interface the operator names) would otherwise be an open model
server: the gateway makes a new secret for each launch, passes it in the environment (never in argv, which
`ps` shows to every user) and sends it on every call. A request without it, or with another, is answered 401
in OpenAI's error shape before it reaches the engine.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

TOKEN_ENV = "VOLTGATE_WORKER_TOKEN"

_REFUSAL = json.dumps(
    {
        "error": {
            "message": "this worker needs the bearer token its gateway was given at launch",
            "type": "authentication_error",
            "param": None,
            "code": "invalid_worker_token",
        }
    }
).encode()


def require_token(app: ASGIApp, environ: Mapping[str, str]) -> ASGIApp:
    """`app`, refusing every HTTP request without `Authorization: Bearer <token>` when `environ` names a
    token; `app` unchanged when it names none."""
    token = environ.get(TOKEN_ENV, "")
    if not token:
        return app
    expected = f"Bearer {token}".encode()

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if hmac.compare_digest(given, expected):
            await app(scope, receive, send)
            return
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": _REFUSAL})

    return guarded
