"""The one error boundary (issue 37, item 3): a route's declared envelope picks the error shape, never its path.

A small app assembled from the gateway's own parts (`GatewayApp`, `DirectDispatch`, `ErrorBoundary`, the
body and edge middlewares) serves two routers at paths chosen to mislead a path sniffer: one at an odd path
declaring Anthropic's envelope, one under /v1/messages declaring OpenAI's. Every kind of error (a raised
`GatewayError` with Retry-After, a 405, a 413 refused before routing, a 422 from FastAPI's validation, a bug)
comes back in the declared shape.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest
from fastapi import APIRouter, Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.testclient import TestClient

from gateway.app import ROUTERS, GatewayApp
from gateway.errors import Envelope, ErrorCode, GatewayError, anthropic_error_body
from gateway.ops.metrics import Metrics
from gateway.routes import messages
from gateway.routes.boundary import ErrorBoundary, declared, speaking
from gateway.routes.direct import DirectRoute
from gateway.serving.middleware import RequestBodyMiddleware, RequestEdgeMiddleware
from gateway.translate.sse import encode_event
from tests.conftest import REPO

ODD = "/odd/place"  # declares Anthropic's envelope
MESSAGES_LIKE = "/v1/messages/openai-shaped"  # declares OpenAI's
MAX_BYTES = 64


def _router(envelope: Envelope, path: str) -> APIRouter:
    router = APIRouter(route_class=speaking(envelope, DirectRoute))

    @router.post(path)
    async def refuse(request: Request) -> Response:
        if request.headers.get("x-bug"):
            raise RuntimeError("a bug")
        raise GatewayError(ErrorCode.QUEUE_FULL, "busy", retry_after_s=3)

    @router.post(path + "/typed")
    async def typed(count: int) -> dict[str, int]:  # FastAPI validates `count`: a 422 becomes our 400
        return {"count": count}

    return router


@pytest.fixture
def client() -> Iterator[TestClient]:
    routers = (_router(Envelope.ANTHROPIC, ODD), _router(Envelope.OPENAI, MESSAGES_LIKE))
    app = GatewayApp()
    for router in routers:
        app.include_router(router)
    routes = [route for router in routers for route in router.routes]
    boundary = app.boundary = ErrorBoundary(routes)
    boundary.install(app)
    app.direct_routes = routes
    app.edges = lambda inner: RequestEdgeMiddleware(
        RequestBodyMiddleware(inner, max_bytes=MAX_BYTES, timeout_s=5.0, render=boundary), Metrics(), boundary
    )
    with TestClient(app) as http:
        yield http


def _is_anthropic(body: dict[str, object]) -> bool:
    return body.get("type") == "error" and isinstance(body.get("error"), dict) and "code" not in body["error"]


def _is_openai(body: dict[str, object]) -> bool:
    return set(body) == {"error"} and isinstance(body["error"], dict) and "code" in body["error"]


@pytest.mark.parametrize(("path", "shape"), [(ODD, _is_anthropic), (MESSAGES_LIKE, _is_openai)])
def test_every_error_comes_in_the_declared_envelope(client: TestClient, path: str, shape: object) -> None:
    assert callable(shape)
    raised = client.post(path, json={})
    assert raised.status_code == 429 and raised.headers["retry-after"] == "3" and shape(raised.json()), raised.text
    wrong_method = client.get(path)
    assert wrong_method.status_code == 405 and shape(wrong_method.json()), wrong_method.text
    too_large = client.post(path, content=b"x" * (MAX_BYTES + 1), headers={"content-type": "application/json"})
    assert too_large.status_code == 413 and shape(too_large.json()), too_large.text
    invalid = client.post(path + "/typed?count=many")
    assert invalid.status_code == 400 and shape(invalid.json()), invalid.text
    bug = client.post(path, json={}, headers={"x-bug": "1"})
    assert bug.status_code == 500 and shape(bug.json()) and bug.headers["x-request-id"], bug.text


def test_a_path_no_route_matches_is_answered_in_openais_envelope(client: TestClient) -> None:
    for path in ("/nowhere", "/v1/messages-like/batches"):
        response = client.get(path)
        assert response.status_code == 404 and _is_openai(response.json()), response.text


def test_the_gateways_routers_declare_their_envelopes() -> None:
    for router in ROUTERS:
        for route in router.routes:
            want = Envelope.ANTHROPIC if router is messages.router else Envelope.OPENAI
            assert declared(route) is want, getattr(route, "path", route)


def test_a_route_without_a_declared_envelope_is_refused_when_the_app_is_built() -> None:
    router = APIRouter()

    @router.get("/v1/undeclared")
    async def undeclared() -> dict[str, str]:
        return {}

    assert isinstance(router.routes[0], APIRoute)
    with pytest.raises(TypeError, match="/v1/undeclared"):
        ErrorBoundary(router.routes)


def test_anthropics_stream_error_frame_is_its_error_event() -> None:
    error = GatewayError(ErrorCode.WORKER_UNAVAILABLE, "worker died")
    assert Envelope.ANTHROPIC.sse(error) == encode_event(anthropic_error_body(error))
    assert Envelope.OPENAI.sse(error) == b'data: {"error": {"message": "worker died", "type": "server_error", ' + (
        b'"param": null, "code": "worker_unavailable"}}\n\n'
    )


def test_only_gateway_errors_renders_an_envelope() -> None:
    """Anthropic's envelope is rendered through `Envelope` (its stream's `MessagesStream.fail` aside, which
    builds the same event from a status), and no module builds a path-picked error response of its own."""
    renderers = {"anthropic_error_body", "error_response", "sse_error_frame", "_render_error"}
    callers = []
    for path in sorted((REPO / "gateway").rglob("*.py")):
        if path == REPO / "gateway" / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name | ast.Attribute):
                name = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
                if name in renderers:
                    callers.append(f"{path.relative_to(REPO)}:{node.lineno} calls {name}")
    assert callers == [], callers


def test_no_module_picks_an_envelope_by_the_messages_path() -> None:
    """The Messages path is named by its routes and the metrics' endpoint labels, nowhere else (no sniffing)."""
    named = {
        str(path.relative_to(REPO))
        for path in (REPO / "gateway").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("/v1/messages")
    }
    assert named == {"gateway/routes/messages.py", "gateway/serving/middleware.py"}


def test_a_path_in_a_declared_namespace_no_route_serves_is_answered_in_that_apis_envelope() -> None:
    """Anthropic's Message Batches API lives under /v1/messages, which the Messages routes declare as
    Anthropic's: its 404 is in Anthropic's envelope, as an Anthropic SDK reads it; a neighbour is not."""
    boundary = ErrorBoundary([route for router in ROUTERS for route in router.routes], messages.NAMESPACES)

    def scope(path: str, method: str = "GET") -> dict[str, object]:
        return {"type": "http", "path": path, "method": method, "root_path": ""}

    assert boundary.envelope(scope("/v1/messages/batches")) is Envelope.ANTHROPIC
    assert boundary.envelope(scope("/v1/messages/batches/b1/results")) is Envelope.ANTHROPIC
    assert boundary.envelope(scope("/v1/messages", "GET")) is Envelope.ANTHROPIC  # a 405 of the route itself
    assert boundary.envelope(scope("/v1/messagesx")) is Envelope.OPENAI
    assert boundary.envelope(scope("/v1/nowhere")) is Envelope.OPENAI
