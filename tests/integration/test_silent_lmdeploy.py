"""An LMDeploy (TurboMind) worker that goes silent ends its calls at their silence bound, not `upstream_timeout_s`.

TurboMind needs a GPU, so its worker is a stand-in here (`tests.fakes.silent_engine.SilentEngine`: accepts the
call, sends a stream's headers, then nothing), reached through the real service, upstream and relay over a real
socket, with a plan's prediction for the model: a stream ends with the `upstream_timeout` error frame naming
the model, a non-streamed call with the 504, both counted as timeouts are.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from starlette.requests import Request

from backends.base import DeploymentPlan, EngineName
from backends.lmdeploy import LMDeployAdapter
from gateway.admission import Admission
from gateway.config import ServerSettings
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.ops.auth import OPEN
from gateway.ops.metrics import Metrics
from gateway.protocol import ChatCompletionRequest, parse_request
from gateway.serving.service import RequestContext, Service, StreamSession
from tests.fakes.asgi_worker import FakeWorker
from tests.fakes.silent_engine import SilentEngine

MODEL = "tm"
# A fast GPU's plan: one session, so the bound of a short call is the floor (the unit tests check the sums).
PREDICTION = SimpleNamespace(prefill_tok_s=20_000.0, decode_tok_s_per_stream=80.0, sessions=1, context_tokens=4096)
FLOOR_S = 0.5


def _service(url: str, client: httpx.AsyncClient) -> Service:
    plan = DeploymentPlan(model="tm-worker", engine=EngineName.LMDEPLOY, source_path=Path("/m"), model_format="hf",
                          context_tokens=4096, slots=1)  # fmt: skip
    worker = FakeWorker(MODEL, url)
    worker.start()
    registry = Registry()
    registry.add(Deployment(MODEL, (), plan, LMDeployAdapter(), worker, Admission(MODEL, 1, 4, queue_timeout_s=5)))
    settings = ServerSettings(stream_silence_floor_s=FLOOR_S, upstream_timeout_s=3600)
    metrics = Metrics(gpu=False)
    metrics.live.predictions[MODEL] = PREDICTION  # type: ignore[assignment]
    return Service(registry, client, settings, metrics)


async def _handle(service: Service, stream: bool) -> object:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": stream}
    parsed = parse_request(json.dumps(body).encode(), ChatCompletionRequest)

    async def receive() -> dict[str, object]:
        await asyncio.Event().wait()  # the client stays
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    ctx = RequestContext(request_id="req-1", principal=OPEN, started=0.0)
    return await service.handle(parsed, request, ctx)


def _count(service: Service, status: int) -> float:
    labels = {"model": MODEL, "endpoint": "chat", "status": str(status)}
    return service.metrics.registry.get_sample_value("voltgate:requests_total", labels) or 0.0


async def test_a_silent_lmdeploy_stream_ends_with_the_timeout_frame_naming_the_model() -> None:
    async with SilentEngine() as engine, httpx.AsyncClient() as client:
        service = _service(engine.url, client)
        session = await _handle(service, stream=True)
        assert isinstance(session, StreamSession)
        frames: AsyncIterator[bytes] = session.frames()
        text = b"".join(await asyncio.wait_for(_all(frames), 60)).decode()  # a hang guard, not a speed limit
    assert engine.calls == 1
    errors = [json.loads(line[6:])["error"] for line in text.splitlines() if line.startswith('data: {"error"')]
    assert len(errors) == 1 and errors[0]["code"] == "upstream_timeout" and MODEL in errors[0]["message"], text
    assert text.rstrip().endswith("data: [DONE]")


async def test_a_silent_lmdeploy_unary_call_is_the_504_naming_the_model_and_counted() -> None:
    async with SilentEngine() as engine, httpx.AsyncClient() as client:
        service = _service(engine.url, client)
        with pytest.raises(GatewayError) as info:
            await asyncio.wait_for(_handle(service, stream=False), 60)  # a hang guard, not a speed limit
    assert engine.calls == 1
    assert info.value.code is ErrorCode.UPSTREAM_TIMEOUT and info.value.status == 504
    assert MODEL in info.value.message
    assert _count(service, 504) == 1


async def _all(frames: AsyncIterator[bytes]) -> list[bytes]:
    return [frame async for frame in frames]
