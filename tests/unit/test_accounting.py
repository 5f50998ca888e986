"""Every request that reaches an inference route gets one access-log line and is counted, whatever its status."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.app import create_app
from gateway.config import Config
from gateway.ops.metrics import Metrics

USER = [{"role": "user", "content": "hi"}]
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}


@contextlib.asynccontextmanager
async def gateway(metrics: Metrics, **auth: object) -> AsyncIterator[httpx.AsyncClient]:
    cfg = Config.model_validate(
        {"models": [{"name": "m", "sources": [{"gguf": "/nonexistent.gguf"}]}], "auth": {"keys_env": None, **auth}}
    )
    app = create_app(cfg, [], refused={"m": "does not fit"}, metrics=metrics)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http


@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"model": "m", "messages": [', 400),
        ({"model": "m", "messages": USER, "stop": [str(i) for i in range(17)]}, 400),
        ({"model": "m", "messages": USER, "mirostat": 2}, 400),
        ({"model": "m", "messages": [{"role": "assistant", "content": [IMAGE]}]}, 400),
        ({"model": "m", "messages": USER, "functions": [{"name": "f"}]}, 400),
        ({"model": "other", "messages": USER}, 404),
        ({"model": "m", "messages": USER}, 503),  # configured, but not placed
    ],
)
async def test_refused_requests_are_logged_and_counted(
    body: object, status: int, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics(gpu=False)
    caplog.set_level(logging.INFO, logger="voltgate.access")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with gateway(metrics) as http:
        response = await http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]
    assert [line["status"] for line in lines] == [status]
    assert lines[0]["request_id"] == response.headers["x-request-id"]
    total = sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == "voltgate:requests"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["status"] == str(status)
    )
    assert total == 1


async def test_a_request_without_a_valid_key_is_logged_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    metrics = Metrics(gpu=False)
    caplog.set_level(logging.INFO, logger="voltgate.access")
    key = {"id": "team", "sha256": "0" * 64}
    async with gateway(metrics, keys=[key]) as http:
        response = await http.post("/v1/chat/completions", json={"model": "m", "messages": USER})
    assert response.status_code == 401
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]
    assert [(line["status"], line["key_id"]) for line in lines] == [(401, "-")]
    value = metrics.registry.get_sample_value(
        "voltgate:requests_total", {"model": "unknown", "endpoint": "chat", "status": "401"}
    )
    assert value == 1
