"""The request path's shortcuts before the first token: `DirectRoute` handlers, the worker URL kept parsed,
the worker body's defaults made once. Each must behave as the long way did."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient
from starlette.responses import JSONResponse, Response

from backends.remote import RemoteAdapter
from backends.request import EngineRequest
from gateway.deployments import Deployment
from gateway.routes.direct import DirectRoute, takes_request_only
from gateway.serving.upstream import Upstream


async def whole(request: Request) -> Response:
    return JSONResponse({"path": request.url.path, "body": (await request.body()).decode()})


async def with_param(request: Request, item: str, flag: bool = False) -> Response:
    return JSONResponse({"item": item, "flag": flag})


def test_request_only_endpoint_is_its_own_handler_and_others_keep_fastapis() -> None:
    router = APIRouter(route_class=DirectRoute)
    router.add_api_route("/whole", whole, methods=["POST"])
    router.add_api_route("/items/{item}", with_param, methods=["GET"])
    app = FastAPI()
    app.include_router(router)
    direct, other = (r for r in router.routes if isinstance(r, DirectRoute))
    assert direct.get_route_handler() is whole
    assert cast(object, other.get_route_handler()) is not with_param  # parameters to solve: FastAPI's handler
    client = TestClient(app)
    assert client.post("/whole", content=b"raw").json() == {"path": "/whole", "body": "raw"}
    assert client.get("/items/x?flag=true").json() == {"item": "x", "flag": True}
    assert set(app.openapi()["paths"]) == {"/whole", "/items/{item}"}


def test_takes_request_only() -> None:
    def sync(request: Request) -> Response:
        return Response()

    async def two(request: Request, other: int) -> Response:
        return Response()

    async def untyped(request):
        return Response()

    assert takes_request_only(whole)
    assert not any(takes_request_only(f) for f in (sync, two, untyped, with_param))


def test_worker_url_follows_a_worker_that_moved() -> None:
    worker = SimpleNamespace(root="http://127.0.0.1:9001", headers={})
    worker.base_url = lambda: worker.root
    deployment = cast(Deployment, SimpleNamespace(worker=worker, adapter=RemoteAdapter()))
    upstream = Upstream(deployment, httpx.AsyncClient(), httpx.Timeout(5.0))
    chat = EngineRequest(model="m", messages=({"role": "user", "content": "hi"},))
    text = EngineRequest(model="m", prompt="hi")
    assert str(upstream._request(chat).url) == "http://127.0.0.1:9001/v1/chat/completions"
    assert str(upstream._request(text).url) == "http://127.0.0.1:9001/v1/completions"
    for port in range(9002, 9010):  # restarts: each new address is used, the stale ones do not pile up
        worker.root = f"http://127.0.0.1:{port}"
        assert str(upstream._request(chat).url) == f"http://127.0.0.1:{port}/v1/chat/completions"
    assert len(upstream._urls) <= 4


def test_wire_leaves_top_level_defaults_out_and_keeps_the_rest() -> None:
    body: dict[str, Any] = {"model": "m", "prompt": "hi", "stream": False, "stop": (), "temperature": 0.0,
                            "max_tokens": 8, "stream_options": None}  # fmt: skip
    assert EngineRequest.model_validate(body).wire() == {
        "model": "m",
        "prompt": "hi",
        "temperature": 0.0,
        "max_tokens": 8,
    }
    streamed = EngineRequest.model_validate(body | {"stream": True, "stream_options": {"include_usage": True}})
    assert streamed.wire()["stream"] is True
    assert streamed.wire()["stream_options"] == {"include_usage": True}
