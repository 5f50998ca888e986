"""`DirectRoute`: a FastAPI route whose handler takes the `Request` alone and is called with it directly.

FastAPI's route handler solves the endpoint's dependencies, reads and validates declared bodies and parameters,
and serialises a returned model, on every request. An endpoint whose one parameter is the `Request` (every
inference route: they parse their own bodies, `gateway.protocol.parsing`) needs none of it, and on the chat
pass-through that work comes before the first token (`bench/relay_seam.py`). The route stays an `APIRoute`:
the OpenAPI schema and the exception handlers are FastAPI's.

`DirectDispatch` goes one step further for the fixed-path POST endpoints: it calls them ahead of FastAPI's
own middleware stack and router, which they do not need (`gateway.app.GatewayApp`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, cast

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import GatewayError, Render

Handler = Callable[[Request], Coroutine[Any, Any, Response]]


def takes_request_only(endpoint: Callable[..., Any]) -> bool:
    """Whether `endpoint` is a coroutine function of one parameter, annotated as the `Request`."""
    params = list(inspect.signature(endpoint).parameters.values())
    return (
        inspect.iscoroutinefunction(endpoint)
        and len(params) == 1
        and params[0].annotation in (Request, "Request")
        and params[0].kind in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD)
    )


class DirectRoute(APIRoute):
    """An `APIRoute` that calls a `Request`-only endpoint as its handler; any other endpoint gets FastAPI's."""

    def get_route_handler(self) -> Handler:
        if takes_request_only(self.endpoint):
            return cast(Handler, self.endpoint)
        return super().get_route_handler()


class DirectDispatch:
    """Serve the fixed-path `DirectRoute` POST endpoints ahead of FastAPI's own stack, as raw ASGI.

    FastAPI wraps every request in its server-error, telemetry, body-limit, exception and exit-stack
    middlewares and the router's match over every route; each adds a frame to the request and a send
    wrapper to every chunk of a stream. An inference endpoint needs none of it: its handler takes the
    `Request`, raises `GatewayError` (rendered by `render`, the gateway's error boundary, in the envelope the
    route declares: the route is set in the scope, as Starlette's router sets it) and returns a `Response`;
    any other exception is a bug, for the same boundary in `RequestEdgeMiddleware`. Every other
    request (other methods, paths with parameters, the docs) goes to `fallback`, FastAPI's stack, unchanged.
    """

    def __init__(self, fallback: ASGIApp, routes: Sequence[BaseRoute], render: Render) -> None:
        self.fallback = fallback
        self.endpoints: dict[str, DirectRoute] = {
            route.path: route
            for route in routes
            if isinstance(route, DirectRoute) and route.methods == {"POST"} and "{" not in route.path
            and takes_request_only(route.endpoint)
        }  # fmt: skip
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.endpoints.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            await self.fallback(scope, receive, send)
            return
        scope["route"] = route
        try:
            response = await route.endpoint(Request(scope, receive, send))
        except GatewayError as exc:
            response = self.render(scope, exc)
        await response(scope, receive, send)
