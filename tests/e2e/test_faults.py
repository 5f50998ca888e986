"""Faults through the real gateway: a worker killed mid-stream, SIGTERM with streams in flight, a killed gateway.

Streams end (never hang), other models keep serving, the worker comes back, and no worker process outlives
its gateway.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, start_gateway, stop_gateway, write_config
from tests.e2e.streams import (
    SSE,
    chat_body,
    counting_body,
    metric,
    open_stream,
    parse_sse,
    ready_model,
    scrape,
    stream,
    worker_for,
    worker_port,
    worker_processes,
    workers_on_ports,
)

pytestmark = pytest.mark.e2e

OTHER = "smollm2-other"
# uvicorn finishes its shutdown, then re-raises the signal it caught, into `voltgate serve`'s handler: exit 0.
CLEAN_EXIT = (0,)


@pytest.fixture(scope="module")
def two_models(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("faults")
    models = [model_entry(smollm2_path, concurrency=2), model_entry(smollm2_path, OTHER, concurrency=1)]
    with running_gateway(write_config(tmp, smollm2_path, free_port(), models=models), tmp / "gateway.log") as gateway:
        yield gateway


def start_one(smollm2_path: Path, tmp: Path, **server: object) -> Gateway:
    gateway = start_gateway(write_config(tmp, smollm2_path, free_port(), **server), tmp / "gateway.log")
    gateway.wait_ready()
    return gateway


async def read_first_chunk(lines: object) -> list[str]:
    seen: list[str] = []
    async for line in lines:  # type: ignore[attr-defined]
        seen.append(line)
        if line.startswith("data: {"):
            return seen
    raise AssertionError(f"stream ended before its first chunk: {seen}")


async def test_worker_killed_mid_stream_ends_the_stream_with_an_error_frame(two_models: Gateway) -> None:
    gateway = two_models
    victim = worker_for(gateway, MODEL)
    async with open_stream(gateway.base_url + "/completions", counting_body(600)) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        seen = await read_first_chunk(lines)
        victim.send_signal(signal.SIGKILL)
        started = time.monotonic()
        seen += await asyncio.wait_for(_rest(lines), 20)  # never hangs
        ended_s = time.monotonic() - started
    sse = SSE(200, response.headers)
    parse_sse("\n".join(seen).encode(), sse)
    assert sse.data[-1] == "[DONE]", seen[-5:]
    assert len(sse.errors) == 1, seen[-5:]
    assert sse.data[-2].startswith('{"error"')  # the error frame comes last, right before [DONE]
    error = sse.errors[0]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error"
    assert ended_s < 10

    # The other model is not affected while this one restarts.
    async with httpx.AsyncClient(timeout=60) as client:
        other = await stream(client, gateway.base_url + "/chat/completions", chat_body(model=OTHER, max_tokens=4))
        assert other.done and not other.errors
        # A request for this model waits for its worker to be restarted (backoff, then its load) and is
        # served: no 503 while a pinned model boots or restarts (issue 21). It may arrive before the crash was
        # even noticed (a 503 for the connection lost), so retry that once.
        for _ in range(2):
            response = await client.post(gateway.base_url + "/chat/completions", json=chat_body(stream=False))
            if response.status_code == 200:
                break
            assert response.status_code == 503 and "connection" in response.text, response.text
        assert response.status_code == 200, response.text
    assert worker_for(gateway, MODEL).pid != victim.pid
    assert ready_model(gateway, MODEL)["restarts"] == 1
    samples = scrape(gateway)
    assert metric(samples, "voltgate:worker_restarts_total", model=MODEL) == 1
    assert metric(samples, "voltgate:worker_restarts_total", model=OTHER) == 0
    assert metric(samples, "voltgate:worker_state", model=MODEL, state="ready") == 1


async def _rest(lines: object) -> list[str]:
    return [line async for line in lines]  # type: ignore[attr-defined]


def assert_gone(gateway: Gateway, worker_pids: set[int], ports: set[int], timeout_s: float = 15) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [pid for pid in worker_pids if psutil.pid_exists(pid) and _not_zombie(pid)]
        orphans = workers_on_ports(ports)
        if not alive and not orphans:
            return
        assert time.monotonic() < deadline, f"worker processes outlived the gateway: {alive} {orphans}"
        time.sleep(0.1)


def _not_zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def test_sigterm_lets_the_inflight_stream_finish_refuses_new_work_and_stops_the_worker(
    smollm2_path: Path, tmp_path: Path
) -> None:
    gateway = start_one(smollm2_path, tmp_path, shutdown_grace_s=30)
    try:
        workers = worker_processes(gateway)
        pids, ports = {p.pid for p in workers}, {worker_port(p) for p in workers}
        assert len(pids) == 1
        async with open_stream(
            gateway.base_url + "/completions", {**counting_body(400), "ignore_eos": True}
        ) as response:
            lines = response.aiter_lines()
            seen = await read_first_chunk(lines)
            gateway.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            # New work is refused while the stream drains (the listening socket is closed).
            async with httpx.AsyncClient(timeout=10) as client:
                with pytest.raises(httpx.ConnectError):
                    await client.post(gateway.base_url + "/chat/completions", json=chat_body(stream=False))
            assert gateway.process.poll() is None  # still draining
            seen += await asyncio.wait_for(_rest(lines), 60)
        sse = SSE(200, response.headers)
        parse_sse("\n".join(seen).encode(), sse)
        assert sse.done and not sse.errors, seen[-5:]
        assert sse.chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert gateway.process.wait(30) in CLEAN_EXIT
        assert_gone(gateway, pids, ports)
    finally:
        stop_gateway(gateway)


async def test_sigterm_grace_is_a_deadline_for_streams_then_the_worker_is_stopped(
    smollm2_path: Path, tmp_path: Path
) -> None:
    gateway = start_one(smollm2_path, tmp_path, shutdown_grace_s=1)
    try:
        workers = worker_processes(gateway)
        pids, ports = {p.pid for p in workers}, {worker_port(p) for p in workers}
        async with open_stream(gateway.base_url + "/completions", counting_body(900)) as response:
            lines = response.aiter_lines()
            await read_first_chunk(lines)
            gateway.process.send_signal(signal.SIGTERM)
            started = time.monotonic()
            with pytest.raises(httpx.HTTPError):  # cut off at the deadline, not left hanging
                await asyncio.wait_for(_rest(lines), 30)
            assert time.monotonic() - started < 10
        assert gateway.process.wait(30) in CLEAN_EXIT
        assert_gone(gateway, pids, ports)
    finally:
        stop_gateway(gateway)


def test_killed_gateway_leaves_no_orphan_worker(smollm2_path: Path, tmp_path: Path) -> None:
    gateway = start_one(smollm2_path, tmp_path)
    try:
        workers = worker_processes(gateway)
        pids, ports = {p.pid for p in workers}, {worker_port(p) for p in workers}
        assert pids
        gateway.process.send_signal(signal.SIGKILL)  # no chance to clean up: the kernel must do it
        gateway.process.wait(10)
        assert_gone(gateway, pids, ports)
    finally:
        stop_gateway(gateway)
