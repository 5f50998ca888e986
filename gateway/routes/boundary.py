"""The gateway's one error boundary: each router declares the error envelope it speaks, one object answers.

    router = APIRouter(route_class=speaking(Envelope.ANTHROPIC, DirectRoute))

`speaking(envelope, base)` is the route class of a router whose routes answer errors in `envelope` (a
class attribute: the router's routes are what the app matches, by their class). `ErrorBoundary(routes)`
takes the routers' routes, each of which must declare an envelope; it finds a request's route as the
router does (the route it matched, else the first whose path and method match, else the first whose path
does: a 405) and renders every error with `gateway.errors.answer` in that route's envelope; a request no
route matches is answered in the envelope of the namespace a router declares for its API's paths (Anthropic's
under `/v1/messages`, where the Message Batches API lives and no route of ours does), else in OpenAI's.
Every error path goes through it: FastAPI's exception handlers
(`install`), the inference routes dispatched ahead of FastAPI (`DirectDispatch`), and the middlewares
outside routing (body size and time, the browser guard, a bug's 500 in `RequestEdgeMiddleware`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import cast

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import Scope

from gateway.errors import Envelope, GatewayError, answer


@functools.cache
def speaking(envelope: Envelope, base: type[APIRoute] = APIRoute) -> type[APIRoute]:
    """`base`, declaring `envelope` as the error envelope of its routes (one class per pair)."""
    name = f"{envelope.name.title()}{base.__name__}"
    return cast(type[APIRoute], type(name, (base,), {"envelope": envelope, "__module__": __name__}))


def declared(route: object) -> Envelope | None:
    """The envelope `route` declares, or None (FastAPI's docs routes, a router that declares none)."""
    envelope = getattr(type(route), "envelope", None)
    return envelope if isinstance(envelope, Envelope) else None


class ErrorBoundary:
    """Every error of the app whose routers' `routes` these are, answered in its route's declared envelope;
    a route that declares none is refused here, when the app is built."""

    def __init__(self, routes: Sequence[BaseRoute], namespaces: Mapping[str, Envelope] | None = None) -> None:
        undeclared = [getattr(r, "path", repr(r)) for r in routes if declared(r) is None]
        if undeclared:
            raise TypeError(f"routes without a declared error envelope (route_class=speaking(...)): {undeclared}")
        self.routes = routes
        self.namespaces = dict(namespaces or {})  # a path prefix -> the envelope of the API that owns it

    def envelope(self, scope: Scope) -> Envelope:
        """The envelope of the route that took (or would take) `scope`: OpenAI's when none matches."""
        envelope = declared(scope.get("route"))  # set once the router (or `DirectDispatch`) matched one
        if envelope is None and scope.get("type") == "http":
            matches = [(r.matches(scope)[0], r) for r in self.routes]
            route = next((r for m, r in matches if m is Match.FULL), None)
            route = route or next((r for m, r in matches if m is Match.PARTIAL), None)
            envelope = declared(route) or self._namespace(scope.get("path", ""))
        return envelope or Envelope.OPENAI

    def _namespace(self, path: str) -> Envelope | None:
        """The envelope of the declared namespace `path` lies in (the prefix itself or below it)."""
        for prefix, envelope in self.namespaces.items():
            if path == prefix or path.startswith(prefix + "/"):
                return envelope
        return None

    def __call__(self, scope: Scope, exc: Exception) -> Response:
        return answer(self.envelope(scope), exc, scope)

    def install(self, app: FastAPI) -> None:
        """FastAPI's handlers for the errors its routing and validation raise, answered here. Any other
        exception is a bug, answered by `RequestEdgeMiddleware` with this boundary (not Starlette's
        ServerErrorMiddleware, which re-raises, so the server drops the connection)."""

        async def handler(request: Request, exc: Exception) -> Response:
            return self(request.scope, exc)

        for kind in (GatewayError, HTTPException, RequestValidationError):
            app.add_exception_handler(kind, handler)
