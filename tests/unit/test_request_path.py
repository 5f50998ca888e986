"""The request path's shortcuts before the first token: `DirectRoute` handlers, the worker URL kept parsed,
the worker body's defaults made once, the fixed-path endpoints dispatched ahead of FastAPI's stack. Each must
behave as the long way did."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, cast

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.responses import JSONResponse, Response

from backends.remote import RemoteAdapter
from backends.request import EngineRequest
from gateway.app import create_app
from gateway.config import Config
from gateway.lifecycle.deployments import Deployment
from gateway.routes.direct import DirectDispatch, DirectRoute, takes_request_only
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


def test_worker_body_bytes_are_what_json_dumps_gave() -> None:
    worker = SimpleNamespace(headers={}, base_url=lambda: "http://127.0.0.1:9001")
    upstream = Upstream(cast(Deployment, SimpleNamespace(worker=worker, adapter=RemoteAdapter())),
                        httpx.AsyncClient(), httpx.Timeout(5.0))  # fmt: skip
    request = EngineRequest(model="m", prompt='é ü "q" \u2028 \U0001f600', temperature=0.7, max_tokens=8, stop=("\n",))
    sent = upstream._request(request).content
    assert sent == json.dumps(request.wire(), ensure_ascii=False, separators=(",", ":")).encode()


def _gateway_app() -> FastAPI:
    config = Config.model_validate(
        {"gpus": "none", "models": [{"name": "m", "sources": [{"remote": "http://127.0.0.1:9/v1"}]}]}
    )
    return create_app(config, [])


def test_direct_dispatch_takes_the_fixed_post_endpoints_and_nothing_else() -> None:
    stack = _gateway_app().build_middleware_stack()
    while not isinstance(stack, DirectDispatch):
        stack = stack.app  # type: ignore[attr-defined]
    assert set(stack.endpoints) == {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/rerank", "/v1/reranking",
        "/v1/responses", "/v1/messages", "/v1/messages/count_tokens",
    }  # fmt: skip
    assert not isinstance(stack.fallback, ServerErrorMiddleware)  # a bug is answered by the gateway's edge


def test_direct_dispatch_renders_errors_as_fastapi_did_and_leaves_other_methods_to_it() -> None:
    with TestClient(_gateway_app()) as client:
        refused = client.post("/v1/chat/completions", json={"model": "m"}, headers={"x-request-id": "r-1"})
        assert refused.status_code == 400 and refused.headers["x-request-id"] == "r-1"
        assert refused.json()["error"]["param"] == "messages"
        unknown = client.post(
            "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
        )
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"
        wrong_method = client.get("/v1/chat/completions")
        assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"].startswith("Method GET")
        assert "openai-processing-ms" in wrong_method.headers


def test_each_call_reads_with_the_bound_for_its_request_and_body_and_without_one_the_upstream_timeout() -> None:
    worker = SimpleNamespace(base_url=lambda: "http://127.0.0.1:9001", headers={})
    deployment = cast(Deployment, SimpleNamespace(worker=worker, adapter=RemoteAdapter()))
    asked: list[tuple[bool, int]] = []

    def read_s(request: Any, body_bytes: int) -> float:
        asked.append((request.stream, body_bytes))
        return 75.0 if request.stream else 40.0

    upstream = Upstream(deployment, httpx.AsyncClient(), httpx.Timeout(600.0), read_s=read_s)
    chat = EngineRequest(model="m", messages=({"role": "user", "content": "hi"},))
    streamed = chat.model_copy(update={"stream": True})
    assert upstream._request(streamed).extensions["timeout"]["read"] == 75.0
    sent = upstream._request(chat)
    assert sent.extensions["timeout"]["read"] == 40.0
    assert asked[-1] == (False, len(sent.content))  # the bytes the worker gets
    plain = Upstream(deployment, httpx.AsyncClient(), httpx.Timeout(600.0))
    assert plain._request(chat).extensions["timeout"]["read"] == 600.0
