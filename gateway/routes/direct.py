"""`DirectRoute`: a FastAPI route whose handler takes the `Request` alone and is called with it directly.

FastAPI's route handler solves the endpoint's dependencies, reads and validates declared bodies and parameters,
and serialises a returned model, on every request. An endpoint whose one parameter is the `Request` (every
inference route: they parse their own bodies, `gateway.protocol.parsing`) needs none of it, and on the chat
pass-through that work comes before the first token (`bench/relay_seam.py`). The route stays an `APIRoute`:
the OpenAPI schema, the exception handlers and FastAPI's per-request exit stacks are unchanged.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Coroutine
from typing import Any, cast

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response

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
