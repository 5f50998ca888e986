"""WorkerProcess against a real fake worker process: start, readiness, failures, restarts, teardown."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import httpx
import pytest

from backends.base import LaunchSpec
from gateway.errors import GatewayError
from gateway.supervisor import WorkerProcess, WorkerState
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
        worker = WorkerProcess("m", fake(), client=client)
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
        worker = WorkerProcess("m", fake("--fail-ready"), client=client)
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
        worker = WorkerProcess("m", fake("--fail-ready", timeout_s=1.5), client=client)
        worker.start()
        try:
            await wait_for(lambda: worker.state is WorkerState.FAILED)
            assert "not ready after" in (worker.last_error or "")
            assert "fake: listening" in (worker.last_error or "")
        finally:
            await worker.stop()


async def test_exit_during_start_reports_the_workers_last_log_lines() -> None:
    async with httpx.AsyncClient() as client:
        worker = WorkerProcess("m", fake("--exit-at-start", "7"), client=client)
        worker.start()
        try:
            await wait_for(lambda: worker.state is WorkerState.FAILED)
            assert "exited with code 7" in (worker.last_error or "")
            assert "failed to load model" in (worker.last_error or "")
        finally:
            await worker.stop()


async def test_repeating_out_of_memory_line_fails_the_start_at_once() -> None:
    async with httpx.AsyncClient() as client:
        worker = WorkerProcess(
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
        worker = WorkerProcess("m", fake("--crash-after", "1"), client=client)
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
        worker = WorkerProcess("m", fake("--ignore-sigterm", "--spawn-child", str(child_pid_file)), client=client)
        worker.start()
        assert await worker.wait_ready(20)
        pid = worker.pid
        assert pid is not None
        child = int(child_pid_file.read_text())
        assert alive(child)
        await worker.stop(grace_s=0.5)
        assert not alive(pid)
        assert not alive(child)
