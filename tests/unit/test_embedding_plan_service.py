"""Embedding and rerank requests through the service, in-process, against a fake pooled-output worker."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.base import DeploymentPlan, EngineName, RequestKind
from backends.llamacpp import LlamaCppAdapter
from backends.remote import RemoteAdapter
from backends.request import MAX_INPUTS, EngineEmbeddingRequest, EngineRerankRequest
from gateway.admission import Admission
from gateway.config import ServerSettings
from gateway.errors import GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.ops.auth import OPEN
from gateway.ops.metrics import Metrics
from gateway.protocol import EmbeddingRequest, parse_request
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.rerank import MAX_DOCUMENTS, parse_rerank_request
from gateway.serving.service import RequestContext, Service, UnaryResult
from tests.fakes.asgi_worker import FakeWorker


class FakePooledWorker:
    """Stands in for `backends.llamacpp.worker.embed_server`: validates bodies with the same engine models, records
    them, answers fixed vectors and scores (with an extra field the gateway must drop from rerank answers)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/embeddings", self._embed, methods=["POST"]),
                                 Route("/v1/rerank", self._rerank, methods=["POST"])])  # fmt: skip

    async def _embed(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append(body)
        EngineEmbeddingRequest.model_validate(body)
        data = [{"object": "embedding", "index": 0, "embedding": [0.6, 0.8]}]
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": 3, "total_tokens": 3}})  # fmt: skip

    async def _rerank(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.received.append(body)
        EngineRerankRequest.model_validate(body)
        results = [{"index": 1, "relevance_score": 2.5, "extra": 1}, {"index": 0, "relevance_score": -1.0}]
        return JSONResponse({"model": body["model"], "object": "list", "results": results,
                             "usage": {"prompt_tokens": 9, "total_tokens": 9}, "timings": {}})  # fmt: skip


def plan(name: str, **fields: Any) -> DeploymentPlan:
    return DeploymentPlan.model_validate({"model": name, "engine": EngineName.LLAMACPP, "context_tokens": 512,
                                          "source_path": Path(f"/m/{name}.gguf"), "model_format": "gguf",
                                          "slots": 4, **fields})  # fmt: skip


class Harness:
    def __init__(self) -> None:
        self.worker = FakePooledWorker()
        self.metrics = Metrics(gpu=False)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.worker.app()))
        registry = Registry()
        for name, p in (("embed", plan("embed-w", task="embed", embed_truncate=True)),
                        ("mrl", plan("mrl-w", task="embed", matryoshka=True)),
                        ("rerank", plan("rerank-w", task="rerank")), ("chat", plan("chat-w"))):  # fmt: skip
            worker = FakeWorker(name)
            worker.start()
            registry.add(Deployment(name, (), p, LlamaCppAdapter(), worker, Admission(name, 4, 4, 5)))
        self.service = Service(registry, client, ServerSettings(), self.metrics)

    async def embed(self, body: dict[str, Any]) -> UnaryResult:
        parsed = parse_request(json.dumps(body).encode(), EmbeddingRequest)
        ctx = RequestContext(request_id="r", principal=OPEN, started=0.0, kind=RequestKind.EMBEDDING)
        result = await self.service.handle(parsed, _request(), ctx)
        assert isinstance(result, UnaryResult)
        return result

    async def rerank(self, body: dict[str, Any]) -> UnaryResult:
        parsed = parse_rerank_request(json.dumps(body).encode())
        ctx = RequestContext(request_id="r", principal=OPEN, started=0.0, kind=RequestKind.RERANK)
        result = await self.service.handle(parsed, _request(), ctx)
        assert isinstance(result, UnaryResult)
        return result


def _request() -> Request:
    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()  # the client never goes away
        return {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)


def test_the_gateway_and_the_worker_agree_on_the_input_limit() -> None:
    # The worker's default limit is this same constant: tests/integration/test_embedding_server.py checks it.
    assert MAX_INPUTS == MAX_DOCUMENTS == 2048


@pytest.mark.parametrize(
    ("inputs", "n"), [("a", 1), (["a", "b"], 2), ([1, 2, 3], 1), ([[1], [2, 3]], 2), ([], 0)]
)  # fmt: skip
def test_inputs_are_counted_as_the_vectors_they_ask_for(inputs: Any, n: int) -> None:
    assert EngineEmbeddingRequest(model="m", input=inputs).inputs == n


def test_the_engine_body_is_openais_without_user_and_with_truncate_only_when_configured() -> None:
    parsed = EmbeddingRequest(model="alias", input=["a"], user="alice", dimensions=8)
    plain = parsed.to_engine(EngineTarget(model="w")).wire()
    assert plain == {"model": "w", "input": ["a"], "dimensions": 8}  # what a remote endpoint gets too
    assert parsed.to_engine(EngineTarget(model="w", embed_truncate=True)).wire()["truncate"] is True
    with pytest.raises(GatewayError) as info:
        EmbeddingRequest(model="m", input=["a"] * 2049).to_engine(EngineTarget(model="w"))
    assert (info.value.param, info.value.status) == ("input", 400)


async def test_an_embedding_request_reaches_the_worker_as_its_own_request_and_is_accounted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    h = Harness()
    caplog.set_level(logging.INFO, logger="voltgate.access")
    result = await h.embed({"model": "embed", "input": "hi", "user": "alice", "encoding_format": "base64"})
    assert result.body is not None and result.body["data"][0]["embedding"] == [0.6, 0.8]
    assert h.worker.received == [{"model": "embed-w", "input": "hi", "encoding_format": "base64", "truncate": True}]
    line = json.loads(next(r.getMessage() for r in caplog.records if r.name == "voltgate.access"))
    assert (line["endpoint"], line["status"], line["prompt_tokens"]) == ("embedding", 200, 3)


async def test_dimensions_reach_only_a_matryoshka_model() -> None:
    h = Harness()
    with pytest.raises(GatewayError) as info:
        await h.embed({"model": "embed", "input": "hi", "dimensions": 4})
    assert (info.value.param, info.value.status) == ("dimensions", 400) and "matryoshka" in info.value.message
    await h.embed({"model": "mrl", "input": "hi", "dimensions": 4})
    assert h.worker.received[-1]["dimensions"] == 4


@pytest.mark.parametrize("model", ["chat", "rerank"])
async def test_an_embedding_request_to_a_model_of_another_task_names_model(model: str) -> None:
    h = Harness()
    with pytest.raises(GatewayError) as info:
        await h.embed({"model": model, "input": "hi"})
    assert (info.value.param, info.value.status) == ("model", 400) and "/v1/embeddings" in info.value.message
    assert h.worker.received == []


async def test_a_rerank_answer_is_normalised_and_accounted_under_rerank() -> None:
    h = Harness()
    result = await h.rerank({"model": "rerank", "query": "q", "documents": ["a", "b"], "top_n": 2, "extra": 1})
    assert h.worker.received == [{"model": "rerank-w", "query": "q", "documents": ["a", "b"], "top_n": 2}]
    results = [{"index": 1, "relevance_score": 2.5}, {"index": 0, "relevance_score": -1.0}]  # extra fields dropped
    usage = {"prompt_tokens": 9, "total_tokens": 9}
    assert result.body == {"model": "rerank-w", "object": "list", "results": results, "usage": usage}
    labels = {"model": "rerank", "endpoint": "rerank", "status": "200"}
    assert h.metrics.registry.get_sample_value("voltgate:requests_total", labels) == 1
    with pytest.raises(GatewayError) as info:
        await h.rerank({"model": "embed", "query": "q", "documents": ["a"]})
    assert info.value.param == "model"


def test_a_remote_endpoint_keeps_answering_dimensions_for_itself() -> None:
    remote = DeploymentPlan(model="r", engine=EngineName.REMOTE, source_path=Path("http://x"), model_format="remote",
                            context_tokens=512, remote_url="http://x")  # fmt: skip
    caps = RemoteAdapter().capabilities(remote)
    assert caps.dimensions and RequestKind.EMBEDDING in caps.kinds and RequestKind.RERANK not in caps.kinds
