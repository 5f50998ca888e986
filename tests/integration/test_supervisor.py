"""WorkerMachine over a WorkerProcess against a real fake worker process: start, readiness, failures, restarts,
teardown."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.base import LaunchSpec
from gateway.errors import GatewayError
from gateway.lifecycle.policy import PINNED, policy_for
from gateway.lifecycle.process import WorkerProcess
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import WorkerState
from tests.conftest import REPO

pytestmark = pytest.mark.integration


def fake(*flags: str, timeout_s: float = 20.0, fatal: tuple[str, ...] = ()):
    def spec(port: int) -> LaunchSpec:
        return LaunchSpec(
            argv=(sys.executable, "-m", "tests.fakes.fake_worker", "--port", str(port), *flags),
            env={"PYTHONPATH": str(REPO)},
            startup_timeout_s=timeout_s,
            fatal_log_patterns=fatal,
        )

    return spec


def supervised(
    name: str,
    spec_for_port: Callable[[int], LaunchSpec],
    *,
    client: httpx.AsyncClient,
    restarts: bool = True,
    **options: Any,
) -> WorkerMachine:
    """The worker of a pinned model (it restarts by itself) or, with `restarts=False`, of an on-demand one, over
    a real local process: what `gateway.app` builds for a model."""
    policy = PINNED if restarts else policy_for("on_demand")
    return WorkerMachine(WorkerProcess(name, spec_for_port, client=client), policy, **options)


async def wait_for(predicate, timeout_s: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); look at its state
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split()[2] != "Z"


async def test_worker_becomes_ready_and_serves() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake(), client=client)
        worker.start()
        try:
            assert await worker.wait_ready(20)
            response = await client.get(worker.base_url() + "/health")
            assert response.status_code == 200
        finally:
            await worker.stop()
        assert worker.state is WorkerState.STOPPED


async def test_requests_while_loading_get_503_with_retry_after() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--fail-ready"), client=client)
        worker.start()
        try:
            await wait_for(lambda: worker.state is WorkerState.STARTING)
            with pytest.raises(GatewayError) as info:
                worker.base_url()
            assert info.value.status == 503
            assert "loading" in info.value.message
            assert "retry-after" in info.value.headers()
        finally:
            await worker.stop()


async def test_never_ready_is_a_failed_start_with_a_clear_message() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--fail-ready", timeout_s=1.5), client=client)
        worker.start()
        try:
            await wait_for(lambda: worker.state is WorkerState.FAILED)
            assert "not ready after" in (worker.last_error or "")
            assert "fake: listening" in (worker.last_error or "")
        finally:
            await worker.stop()


async def test_exit_during_start_reports_the_workers_last_log_lines() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--exit-at-start", "7"), client=client)
        worker.start()
        try:
            await wait_for(lambda: worker.state is WorkerState.FAILED)
            assert "exited with code 7" in (worker.last_error or "")
            assert "failed to load model" in (worker.last_error or "")
        finally:
            await worker.stop()


async def test_a_failed_start_quotes_only_its_own_processs_log_lines() -> None:
    """The first process logs a line of its own and crashes; the restart fails: its error quotes the new
    process, never the lines of the one before."""
    launches: list[int] = []

    def spec(port: int) -> LaunchSpec:
        launches.append(port)
        if len(launches) == 1:
            return fake("--log-line", "a line of the first process", "--crash-after", "1")(port)
        return fake("--exit-at-start", "7")(port)

    async with httpx.AsyncClient() as client:
        worker = supervised("m", spec, client=client)
        worker.start()
        try:
            assert await worker.wait_ready(20)
            await wait_for(lambda: "a line of the first process" in worker.handle.log_lines())
            with pytest.raises(httpx.HTTPError):
                await client.post(worker.base_url() + "/v1/chat/completions", json={"model": "m"})
            await wait_for(lambda: "exited with code 7" in (worker.last_error or ""))
            assert "failed to load model" in (worker.last_error or "")
            assert "first process" not in (worker.last_error or ""), worker.last_error
        finally:
            await worker.stop()


async def test_repeating_out_of_memory_line_fails_the_start_at_once() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised(
            "m",
            fake("--fail-ready", "--log-line", "[TM] out of memory at 0/1", fatal=(r"out of memory at \d+/\d+",)),
            client=client,
        )
        worker.start()
        try:
            await wait_for(lambda: worker.state is WorkerState.FAILED, timeout_s=10)
            assert "out of memory at 0/1" in (worker.last_error or "")
        finally:
            await worker.stop()


async def test_crashed_worker_is_restarted_and_serves_again() -> None:
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--crash-after", "1"), client=client)
        worker.start()
        try:
            assert await worker.wait_ready(20)
            first_pid = worker.pid
            with pytest.raises(httpx.HTTPError):
                await client.post(worker.base_url() + "/v1/chat/completions", json={"model": "m"})
            await wait_for(lambda: worker.state is not WorkerState.READY or worker.pid != first_pid)
            assert await worker.wait_ready(20)
            assert worker.restarts == 1
            assert worker.pid != first_pid
        finally:
            await worker.stop()


async def test_stop_kills_a_worker_that_ignores_sigterm_and_its_children(tmp_path: Path) -> None:
    child_pid_file = tmp_path / "child.pid"
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake("--ignore-sigterm", "--spawn-child", str(child_pid_file)), client=client)
        worker.start()
        assert await worker.wait_ready(20)
        pid = worker.pid
        assert pid is not None
        child = int(child_pid_file.read_text())
        assert alive(child)
        await worker.stop(grace_s=0.5)
        assert not alive(pid)
        assert not alive(child)


class StateLog:
    """Every state a worker enters, with the monotonic time it entered it (the `on_state` hook)."""

    def __init__(self) -> None:
        self.events: list[tuple[float, WorkerState]] = []

    def __call__(self, _name: str, state: WorkerState) -> None:
        self.events.append((time.monotonic(), state))

    def restart_delays(self) -> list[float]:
        """Seconds from each FAILED to the STARTING that ends its backoff."""
        delays, failed_at = [], None
        for at, state in self.events:
            if state is WorkerState.FAILED:
                failed_at = at
            elif state is WorkerState.STARTING and failed_at is not None:
                delays.append(at - failed_at)
                failed_at = None
        return delays


async def kill_when_ready(worker: WorkerMachine, client: httpx.AsyncClient, *, serve_for_s: float = 0.0) -> None:
    """Wait for READY, serve requests for `serve_for_s`, then SIGKILL the worker's process group."""
    assert await worker.wait_ready(30)
    deadline = time.monotonic() + serve_for_s
    while True:
        response = await client.post(worker.base_url() + "/v1/chat/completions", json={"model": "m"})
        assert response.status_code == 200
        if time.monotonic() >= deadline:
            break
        await asyncio.sleep(0.1)
    pid = worker.pid
    assert pid is not None
    os.killpg(pid, signal.SIGKILL)
    await wait_for(lambda: worker.pid != pid and worker.state is not WorkerState.READY)


async def test_backoff_starts_over_once_the_worker_was_healthy_for_a_while() -> None:
    log = StateLog()
    async with httpx.AsyncClient() as client:
        worker = supervised("m", fake(), client=client, on_state=log, healthy_reset_s=1.5)
        worker.start()
        try:
            await kill_when_ready(worker, client)  # crash loop: 1 s, then 2 s
            await kill_when_ready(worker, client)
            await kill_when_ready(worker, client, serve_for_s=2.0)  # served for 2 s >= 1.5 s: back to 1 s
            assert await worker.wait_ready(30)
        finally:
            await worker.stop()
    first, second, third = log.restart_delays()
    assert 0.9 <= first < 1.7 and 1.9 <= second < 2.7, log.restart_delays()
    assert 0.9 <= third < 1.7, f"backoff did not start over after 2 s of health: {log.restart_delays()}"


def slow_fake(load_s: float):
    """The fake worker behind `load_s` of loading (a shell sleep, then exec: the same pid and group)."""

    def spec(port: int) -> LaunchSpec:
        worker = f"{sys.executable} -m tests.fakes.fake_worker --port {port}"
        return LaunchSpec(
            argv=("/bin/sh", "-c", f"sleep {load_s} && exec {worker}"),
            env={"PYTHONPATH": str(REPO)},
            startup_timeout_s=30,
        )

    return spec


async def test_healthy_time_counts_from_ready_not_from_launch() -> None:
    """A model that loads for longer than healthy_reset_s and dies as soon as it is up is a crash loop."""
    log = StateLog()
    async with httpx.AsyncClient() as client:
        worker = supervised("m", slow_fake(2.0), client=client, on_state=log, healthy_reset_s=1.5)
        worker.start()
        try:
            await kill_when_ready(worker, client)
            await kill_when_ready(worker, client)
            await wait_for(lambda: len(log.restart_delays()) == 2, timeout_s=10)
        finally:
            await worker.stop()
    first, second = log.restart_delays()
    assert 0.9 <= first < 1.7
    assert 1.9 <= second < 2.7, f"launch-to-crash time reset the backoff: {log.restart_delays()}"
