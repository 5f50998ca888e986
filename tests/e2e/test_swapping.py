"""Serving more models than memory, through `voltgate serve` on the real SmolLM2 under several names with a
host memory budget that holds one or two of them: on-demand loading, LRU eviction, a pinned model never
evicted, sixteen requests on one load, a request in flight drained before its model is unloaded, idle
unloading, a load that fails reaching every waiter, and `voltgate plan` explaining it all.

Each SmolLM2 worker (context 512) is estimated at 0.21 GiB and measured at about 0.18 GiB (VmRSS).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, free_port
from tests.e2e.conftest import Gateway, model_entry, running_gateway, write_config
from tests.e2e.streams import SSE, chat_body, counting_body, metric, scrape, stream

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SWAP_BUDGET = 700_000_000  # the pinned model and two on-demand ones, never three
ONE_BUDGET = 330_000_000  # exactly one on-demand model
KEEPALIVE_S = 0.5


def smol(path: Path, name: str, **extra: Any) -> dict[str, Any]:
    return model_entry(path, name, context=512, concurrency=1, **extra)


def admin(gateway: Gateway) -> dict[str, dict[str, Any]]:
    data = httpx.get(gateway.url + "/admin/models", timeout=10).json()["data"]
    return {m["model"]: m for m in data}


def states(gateway: Gateway) -> dict[str, str]:
    return {name: m["state"] for name, m in admin(gateway).items()}


def loads(gateway: Gateway, model: str, outcome: str = "ok") -> float:
    return metric(scrape(gateway), "voltgate:model_loads_total", model=model, outcome=outcome) or 0.0


def evictions(gateway: Gateway, model: str, reason: str) -> float:
    return metric(scrape(gateway), "voltgate:model_evictions_total", model=model, reason=reason) or 0.0


def error_message(result: SSE | httpx.Response) -> str:
    """The error a waiter got: a 503, or (headers already sent while it waited) one error frame, then [DONE]."""
    if isinstance(result, httpx.Response):
        assert result.status_code == 503, result.text
        return str(result.json()["error"]["message"])
    if result.status == 200:
        assert len(result.errors) == 1 and result.done, result.body
        return str(result.errors[0]["message"])
    assert result.status == 503, result.body
    return str(json.loads(result.body)["error"]["message"])


async def chat(client: httpx.AsyncClient, gateway: Gateway, model: str, **extra: Any) -> httpx.Response:
    body = {**chat_body(model=model, max_tokens=4), "stream": False, **extra}
    return await client.post(gateway.base_url + "/chat/completions", json=body)


@pytest.fixture(scope="module")
def swap(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("swap")
    models = [
        smol(smollm2_path, "pinned"),
        *(smol(smollm2_path, name, load="on_demand") for name in ("a", "b", "c")),
        model_entry(smollm2_path, "sixteen", context=512, concurrency=4, load="on_demand"),
    ]
    config = write_config(tmp, smollm2_path, free_port(), models=models, memory_budget_bytes=SWAP_BUDGET)
    with running_gateway(config, tmp / "gateway.log") as gateway:
        yield gateway


async def test_the_first_request_loads_an_on_demand_model(swap: Gateway) -> None:
    assert states(swap) == {"pinned": "ready", "a": "unloaded", "b": "unloaded", "c": "unloaded",
                            "sixteen": "unloaded"}  # fmt: skip
    async with httpx.AsyncClient(timeout=120) as client:
        response = await chat(client, swap, "a")
    assert response.status_code == 200, response.text
    a = admin(swap)["a"]
    assert a["state"] == "ready" and a["loads"] == 1 and a["in_flight"] == 0
    assert a["memory"]["host"]["estimated_bytes"] > 0 and a["memory"]["host"]["measured_bytes"] > 100_000_000
    assert loads(swap, "a") == 1
    listed = {m["id"]: m["status"] for m in httpx.get(swap.base_url + "/models").json()["data"]}
    assert listed["a"] == "ready" and listed["b"] == "unloaded"


async def test_a_third_model_evicts_the_least_recently_used_and_never_the_pinned_one(swap: Gateway) -> None:
    pinned_pid = admin(swap)["pinned"]
    async with httpx.AsyncClient(timeout=120) as client:
        assert (await chat(client, swap, "a")).status_code == 200  # a: ready, used
        assert (await chat(client, swap, "b")).status_code == 200  # b fits beside a
        assert states(swap)["a"] == "ready"
        assert (await chat(client, swap, "c")).status_code == 200  # no room for three: a is the oldest
    assert states(swap) == {"pinned": "ready", "a": "unloaded", "b": "ready", "c": "ready", "sixteen": "unloaded"}
    assert evictions(swap, "a", "memory") == 1 and evictions(swap, "b", "memory") == 0
    assert admin(swap)["pinned"]["loads"] == pinned_pid["loads"]  # never reloaded
    assert "unloading a (memory): least recently used" in swap.log()
    assert metric(scrape(swap), "voltgate:model_evictions_total", model="pinned") is None


async def test_sixteen_concurrent_requests_for_a_loading_model_all_succeed_after_one_load(swap: Gateway) -> None:
    async with httpx.AsyncClient(timeout=180, limits=httpx.Limits(max_connections=32)) as client:
        streamed = [stream(client, swap.base_url + "/chat/completions", chat_body(model="sixteen", max_tokens=4))
                    for _ in range(8)]  # fmt: skip
        unary = [chat(client, swap, "sixteen") for _ in range(8)]
        results = await asyncio.gather(*streamed, *unary)
    for sse in results[:8]:
        assert isinstance(sse, SSE) and sse.status == 200 and sse.done and not sse.errors, sse.body[-300:]
    for response in results[8:]:
        assert isinstance(response, httpx.Response) and response.status_code == 200, response.text
    assert loads(swap, "sixteen") == 1
    waited = metric(scrape(swap), "voltgate:model_load_wait_seconds_count", model="sixteen")
    assert waited is not None and waited >= 8
    assert states(swap)["pinned"] == "ready" and admin(swap)["sixteen"]["in_flight"] == 0


async def test_admin_load_and_unload(swap: Gateway) -> None:
    loaded = httpx.post(swap.url + "/admin/models/a/load", timeout=120)
    assert loaded.status_code == 200 and loaded.json()["state"] == "ready", loaded.text
    unloaded = httpx.post(swap.url + "/admin/models/a/unload", timeout=120)
    assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
    assert evictions(swap, "a", "admin") == 1
    pinned = httpx.post(swap.url + "/admin/models/pinned/unload", timeout=10)
    assert pinned.status_code == 400 and "pinned" in pinned.json()["error"]["message"]


def test_voltgate_plan_explains_residency(swap: Gateway) -> None:
    config = swap.log_path.parent / "voltgate.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "gateway", "plan", "--config", str(config)],
        cwd=REPO, capture_output=True, text=True, timeout=120, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "residency (memory for on-demand models: host 0.65 GiB" in out
    assert "pinned: resident: loaded at start, never unloaded" in out
    assert "a: swaps: loaded on demand, evicted when another needs the memory; fits beside b, c" in out


@pytest.fixture(scope="module")
def one(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, Path]]:
    tmp = tmp_path_factory.mktemp("one")
    bad = tmp / "bad.gguf"
    bad.write_bytes(smollm2_path.read_bytes())  # placed as a good file; emptied once the gateway is up
    models = [
        smol(smollm2_path, "x", llamacpp={"n_threads": 2}),
        smol(smollm2_path, "y", idle_unload_s=2),
        smol(bad, "bad"),
    ]
    models = [{**m, "load": "on_demand"} for m in models]
    config = write_config(tmp, smollm2_path, free_port(), models=models, memory_budget_bytes=ONE_BUDGET,
                          keepalive_interval_s=KEEPALIVE_S, drain_timeout_s=60)  # fmt: skip
    with running_gateway(config, tmp / "gateway.log") as gateway:
        bad.write_bytes(b"")
        yield gateway, bad


async def test_a_request_in_flight_on_a_model_that_must_be_evicted_completes_first(one: tuple[Gateway, Path]) -> None:
    gateway, _ = one
    url = gateway.base_url + "/completions"
    async with httpx.AsyncClient(timeout=180) as client:
        body = {**counting_body(200, model="x"), "stream_options": {"include_usage": True}}
        long = asyncio.ensure_future(stream(client, url, body))
        deadline = time.monotonic() + 60
        while admin(gateway)["x"]["in_flight"] == 0:  # x is loaded and its request is generating
            assert time.monotonic() < deadline and not long.done(), gateway.log()[-2000:]
            await asyncio.sleep(0.1)
        waiting = await stream(client, gateway.base_url + "/chat/completions", chat_body(model="y", max_tokens=4))
        finished_first = long.done()
        first = await long
    assert finished_first, "y was answered before x's request had finished"
    assert first.status == 200 and first.done and not first.errors
    assert first.chunks[-1]["usage"]["completion_tokens"] == 200
    assert waiting.status == 200 and waiting.done and not waiting.errors
    said = " ".join(waiting.comments)
    assert "waiting for 1 request(s) on 'x' to finish" in said, waiting.comments
    assert evictions(gateway, "x", "memory") == 1 and states(gateway)["y"] == "ready"


def test_an_idle_model_is_unloaded_after_its_idle_unload_s(one: tuple[Gateway, Path]) -> None:
    gateway, _ = one
    deadline = time.monotonic() + 15
    while states(gateway)["y"] != "unloaded":
        assert time.monotonic() < deadline, admin(gateway)["y"]
        time.sleep(0.2)
    assert evictions(gateway, "y", "idle") == 1
    assert "unloading y (idle): no request for" in gateway.log()


async def test_a_load_that_fails_reaches_every_waiter_as_a_clear_error(one: tuple[Gateway, Path]) -> None:
    gateway, bad = one
    async with httpx.AsyncClient(timeout=120) as client:
        url = gateway.base_url + "/chat/completions"
        results = await asyncio.gather(
            *(stream(client, url, chat_body(model="bad")) for _ in range(2)),
            *(chat(client, gateway, "bad") for _ in range(2)),
        )
        started = time.monotonic()
        again = await chat(client, gateway, "bad")
        again_s = time.monotonic() - started
    messages = [error_message(result) for result in results]
    assert len(messages) == 4
    for message in messages:
        assert "model 'bad' failed to load" in message and "failed to read magic" in message, message
    assert again.status_code == 503 and again_s < 1.0  # remembered: refused at once, no new load
    assert "model 'bad' failed to load" in again.json()["error"]["message"]
    assert 1 <= int(again.headers["retry-after"]) <= 60
    assert loads(gateway, "bad", "failed") == 1
    assert admin(gateway)["bad"]["state"] == "failed" and admin(gateway)["bad"]["error"]
    assert str(bad) in gateway.log()
