"""Requests for on-demand models through the service (no sockets): a stream waits for the load inside its
StreamSession (headers, comments saying what it waits for, then the answer or one error frame), progress
chunks only when asked for, a unary request waits and is answered, and every path releases its hold."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import pytest
from starlette.requests import Request

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp import LlamaCppAdapter
from gateway.admission import Admission
from gateway.config import ServerSettings
from gateway.errors import GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import HOST, NoProbe, Pools
from gateway.lifecycle.residency import Residency
from gateway.lifecycle.workers import Status as ModelState
from gateway.ops.auth import OPEN
from gateway.ops.metrics import Metrics
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.serving.service import RequestContext, Service, StreamSession, UnaryResult
from tests.fakes.asgi_worker import FakeEngine
from tests.fakes.loading_worker import FakeLoadingWorker

USER = [{"role": "user", "content": "hi"}]


class Harness:
    def __init__(self, *, load_s: float, fail: str | None = None, keepalive_s: float = 0.05) -> None:
        self.engine = FakeEngine()
        self.metrics = Metrics(gpu=False)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.engine.app()))
        registry = Registry()
        settings = ServerSettings(keepalive_interval_s=keepalive_s, load_wait_s=5)
        self.residency = Residency(registry, settings, self.metrics, Pools({HOST: None}, NoProbe()))
        self.worker = FakeLoadingWorker("od", load_s=load_s, fail=fail, on_state=self.residency.on_worker_state)
        plan = DeploymentPlan(model="od", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
                              context_tokens=512, slots=2)  # fmt: skip
        self.deployment = Deployment("od", (), plan, LlamaCppAdapter(), self.worker, Admission("od", 2, 8, 5),
                                     load="on_demand")  # fmt: skip
        registry.add(self.deployment)
        self.service = Service(registry, self.client, settings, self.metrics, self.residency)

    async def call(self, body: dict[str, object], headers: dict[str, str] | None = None) -> UnaryResult | StreamSession:
        parsed = parse_request(json.dumps(body).encode(), ChatCompletionRequest)
        ctx = RequestContext(request_id="req-1", principal=OPEN, started=0.0)
        return await self.service.handle(parsed, _request(headers or {}), ctx)

    def in_flight(self) -> int:
        return int(self.residency.describe(self.deployment)["in_flight"])


def _request(headers: dict[str, str]) -> Request:
    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw}, receive)


async def _drain(session: StreamSession) -> bytes:
    return b"".join([frame async for frame in session.frames()])


async def test_a_stream_for_an_unloaded_model_gets_loading_comments_then_its_answer() -> None:
    h = Harness(load_s=0.3)
    session = await h.call({"model": "od", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    frames = await _drain(session)
    assert frames.startswith(b": loading model 'od': ")
    assert b"data: {" in frames and frames.endswith(b"data: [DONE]\n\n")
    assert b"voltgate_progress" not in frames  # progress chunks are opt-in
    assert h.worker.starts == 1 and h.in_flight() == 0


async def test_progress_chunks_when_the_request_asks_for_them() -> None:
    h = Harness(load_s=1.2, keepalive_s=10)
    session = await h.call({"model": "od", "messages": USER, "stream": True}, {"x-voltgate-progress": "data"})
    assert isinstance(session, StreamSession)
    frames = (await _drain(session)).split(b"\n\n")
    progress = [json.loads(f[6:]) for f in frames if f.startswith(b"data: {") and b"voltgate_progress" in f]
    assert progress, frames
    first = progress[0]
    assert first["object"] == "chat.completion.chunk" and first["choices"] == []
    assert first["voltgate_progress"]["status"] == "loading"
    assert "loading model 'od'" in first["voltgate_progress"]["message"]
    chunks = [c async for c in (await h.call({"model": "od", "messages": USER, "stream": True})).chunks()]  # type: ignore[union-attr]
    assert all("voltgate_progress" not in c for c in chunks)


async def test_a_failed_load_after_the_headers_is_one_error_frame_then_done() -> None:
    h = Harness(load_s=0.2, fail="exited with code 1 during start; last log lines: bad magic")
    session = await h.call({"model": "od", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    frames = await _drain(session)
    errors = [json.loads(f[6:]) for f in frames.split(b"\n\n") if f.startswith(b'data: {"error"')]
    assert len(errors) == 1 and "bad magic" in errors[0]["error"]["message"]
    assert errors[0]["error"]["code"] == "worker_unavailable"
    assert frames.endswith(b"data: [DONE]\n\n") and h.in_flight() == 0
    with pytest.raises(GatewayError) as info:  # remembered: the next request is refused at once
        await h.call({"model": "od", "messages": USER, "stream": True})
    assert info.value.status == 503 and "bad magic" in info.value.message
    assert h.worker.starts == 1


async def test_a_fast_failed_load_before_the_headers_keeps_its_http_status() -> None:
    h = Harness(load_s=0.01, fail="no such file", keepalive_s=5)
    with pytest.raises(GatewayError) as info:
        await h.call({"model": "od", "messages": USER, "stream": True})
    assert info.value.status == 503 and "no such file" in info.value.message


async def test_a_unary_request_waits_for_the_load_and_is_answered() -> None:
    h = Harness(load_s=0.2)
    results = await asyncio.gather(*(h.call({"model": "od", "messages": USER}) for _ in range(4)))
    assert all(isinstance(r, UnaryResult) and r.body is not None for r in results)
    assert h.worker.starts == 1 and h.in_flight() == 0
    assert h.residency.state(h.deployment) is ModelState.READY
    waited = h.metrics.registry.get_sample_value("voltgate:model_load_wait_seconds_count", {"model": "od"})
    assert waited == 4


async def test_a_stream_closed_while_it_waits_for_the_load_holds_nothing() -> None:
    h = Harness(load_s=0.3)
    session = await h.call({"model": "od", "messages": USER, "stream": True})
    assert isinstance(session, StreamSession)
    await session.close()
    await asyncio.sleep(0.4)
    assert h.in_flight() == 0
    assert h.residency.state(h.deployment) in (ModelState.READY, ModelState.UNLOADED)
