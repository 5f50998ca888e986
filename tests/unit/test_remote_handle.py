"""A remote endpoint's model under `WorkerMachine`: `RemoteHandle` against a real OpenAI endpoint on loopback
(uvicorn + Starlette, stopped and started again on the same port), under the `REMOTE` policy with its times
scaled down. READY when it answers, FAILED with a 503 naming it when it stops, READY again by itself within
the bound however many checks failed (it never gives up), and `stop()` in every state."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.base import DeploymentPlan, EngineName
from backends.remote import RemoteAdapter
from gateway.app import _deployment
from gateway.config import Config, ModelSpec
from gateway.errors import GatewayError
from gateway.lifecycle import policy
from gateway.lifecycle.memory import ModelMemory
from gateway.lifecycle.policy import CRASH_LIMIT, REMOTE, REMOTE_BACKOFF_MAX_S, Backoff, policy_for
from gateway.lifecycle.remote import CHECK_TIMEOUT_S, RemoteHandle
from gateway.lifecycle.resident import Resident
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import WorkerHandle, WorkerStartError, WorkerState
from gateway.ops.metrics import Metrics
from tests.conftest import free_port

CAP_S = 0.3
FAST = dataclasses.replace(REMOTE, backoff_max_s=CAP_S)  # REMOTE with its cap scaled down like the checks below
# The cap, one start's window, and room for a loaded test machine (0.5 s was missed once in a 20-minute CI run on
# 2 cores). Still below what an uncapped backoff would wait after the 7 failures `comes_back` waits for
# (0.05 s doubling: 3.2 s), so a lost cap still fails these tests.
BOUND_S = CAP_S + 0.1 + 2.0


class Endpoint:
    """An OpenAI endpoint on another host, standing on loopback: `GET /v1/models` answers `status` after `delay_s`;
    `stop()` closes its socket (connection refused), `start()` opens it again on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.status = 200
        self.delay_s = 0.0
        self.checks = 0
        self.workers: list[WorkerMachine] = []  # the models in front of it, stopped at the end of a test
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def _models(self, _: Request) -> JSONResponse:
        self.checks += 1
        await asyncio.sleep(self.delay_s)
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]}, status_code=self.status)

    async def start(self) -> None:
        app = Starlette(routes=[Route("/v1/models", self._models)])
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            assert not self._task.done(), "the endpoint did not start"
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
            self._server = self._task = None


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[Endpoint, httpx.AsyncClient]]:
    """An endpoint (not started yet) and the gateway's shared client, in the test's own event loop."""
    endpoint = Endpoint()
    try:
        async with httpx.AsyncClient() as client:
            try:
                yield endpoint, client
            finally:
                await asyncio.gather(*(worker.stop() for worker in endpoint.workers))
    finally:
        await endpoint.stop()


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "BACKOFF_INITIAL_S", 0.05)


def remote(endpoint: Endpoint, client: httpx.AsyncClient, crashes: list[str] | None = None) -> WorkerMachine:
    """What `gateway.app` builds for a `remote` source, with its checks every 0.1 s instead of 5 s."""
    handle: WorkerHandle = RemoteHandle("m", endpoint.url, client=client, interval_s=0.1, poll_s=0.05,
                                        start_window_s=0.1)  # fmt: skip
    on_crash = None if crashes is None else (lambda _, cause: crashes.append(cause))
    worker = WorkerMachine(handle, FAST, on_crash=on_crash)
    endpoint.workers.append(worker)
    return worker


async def until(predicate: object, timeout_s: float = 5.0) -> None:
    async def wait() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout_s)


def unavailable(worker: WorkerMachine) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        worker.base_url()
    assert info.value.status == 503 and info.value.retry_after_s is not None
    return info.value


def test_the_remote_policy_never_gives_up_and_caps_its_backoff() -> None:
    assert policy_for("always", remote=True) is REMOTE and policy_for("always") is not REMOTE
    assert (REMOTE.at_boot, REMOTE.evictable, REMOTE.restarts, REMOTE.gives_up) == (True, False, True, False)
    backoff = Backoff(max_s=REMOTE.backoff_max_s)
    waits = [backoff.fail() for _ in range(5000)]  # more than 6 hours of checks every 5 s, and no overflow
    assert max(waits) == REMOTE_BACKOFF_MAX_S == 5.0
    assert REMOTE_BACKOFF_MAX_S + CHECK_TIMEOUT_S <= 10.0  # the bound docs/lifecycle.md states


async def test_ready_while_it_answers_then_failed_with_a_503_naming_it() -> None:
    async with serving() as (endpoint, client):
        await ready_then_failed(endpoint, client)


async def ready_then_failed(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    await endpoint.start()
    crashes: list[str] = []
    worker = remote(endpoint, client, crashes)
    await worker.ensure_ready(5)
    assert worker.base_url() == endpoint.url and worker.pid is None
    endpoint.status = 502
    await until(lambda: worker.state is WorkerState.FAILED)
    error = unavailable(worker)
    assert f"its endpoint {endpoint.url} is not answering" in error.message
    assert "answered 502" in error.message and "loading" not in error.message and "restarted" not in error.message
    endpoint.status = 200
    await until(lambda: worker.state is WorkerState.READY)
    await endpoint.stop()
    await until(lambda: worker.state is WorkerState.FAILED)
    error = unavailable(worker)
    assert endpoint.url in error.message and "ConnectError" in error.message
    # a call broken once the endpoint is known to be down also says how it went down
    assert worker.connection_lost("ReadError") == (
        f"model 'm': the connection to its endpoint {endpoint.url} was lost (ReadError: {worker.last_error})"
    )
    started = time.monotonic()
    with pytest.raises(WorkerStartError, match="is not answering"):  # a request waiting meanwhile: not a hang
        await worker.await_ready(30)
    assert time.monotonic() - started < BOUND_S
    assert crashes[:2] == ["unhealthy", "unreachable"]
    await worker.stop()


async def test_it_comes_back_by_itself_within_the_bound_after_many_failures() -> None:
    async with serving() as (endpoint, client):
        await comes_back(endpoint, client)


async def comes_back(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    crashes: list[str] = []
    worker = remote(endpoint, client, crashes)
    worker.start()  # its endpoint is down from the start
    await until(lambda: len(crashes) > 2 * CRASH_LIMIT)
    assert worker.gave_up is None and worker.state is not WorkerState.READY
    assert "loading" not in unavailable(worker).message
    await endpoint.start()
    answered = time.monotonic()
    assert await worker.wait_ready(BOUND_S), f"not READY within {BOUND_S} s of its endpoint answering"
    assert worker.base_url() == endpoint.url and time.monotonic() - answered < BOUND_S
    await endpoint.stop()  # and again, with the streak still long: no give-up on the way down either
    await until(lambda: worker.state is WorkerState.FAILED)
    await endpoint.start()
    assert await worker.wait_ready(BOUND_S)
    await worker.stop()


async def test_stop_works_in_every_state_and_ends_the_checks() -> None:
    async with serving() as (endpoint, client):
        await stops_everywhere(endpoint, client)


async def stops_everywhere(endpoint: Endpoint, client: httpx.AsyncClient) -> None:
    idle = remote(endpoint, client)
    await idle.stop()  # STOPPED, never started
    assert idle.state is WorkerState.STOPPED
    await endpoint.start()
    endpoint.delay_s = 1.0  # a start that waits on a slow answer: STARTING
    starting = remote(endpoint, client)
    starting.start()
    await until(lambda: endpoint.checks == 1)
    assert starting.state is WorkerState.STARTING
    await asyncio.wait_for(starting.stop(), 0.5)
    endpoint.delay_s = 0.0
    ready = remote(endpoint, client)
    await ready.ensure_ready(5)
    await ready.stop()  # READY
    await endpoint.stop()
    failed = remote(endpoint, client)
    failed.start()
    await until(lambda: failed.state is WorkerState.FAILED)
    await failed.stop()  # FAILED, in its backoff
    for worker in (starting, ready, failed):
        assert worker.state is WorkerState.STOPPED
        assert "shutting down" in unavailable(worker).message
    await endpoint.start()
    checks = endpoint.checks
    await asyncio.sleep(0.4)  # longer than every interval and backoff above
    assert endpoint.checks == checks  # nothing checks it any more
    await ready.stop()  # idempotent


async def test_the_gateway_builds_a_remote_source_as_this_machine_under_the_remote_policy() -> None:
    spec = ModelSpec.model_validate({"name": "r", "sources": [{"remote": "http://gpu-2:8000/v1"}]})
    config = Config.model_validate({"gpus": "none", "models": [spec.model_dump(exclude_none=True)]})
    plan = DeploymentPlan(model="r", engine=EngineName.REMOTE, source_path=Path("http://gpu-2:8000/v1"),
                          model_format="remote", context_tokens=512, remote_url="http://gpu-2:8000")  # fmt: skip
    async with httpx.AsyncClient() as client:
        deployment = _deployment(plan, config.models[0], RemoteAdapter(), client, config, Metrics())
    worker = deployment.worker
    assert isinstance(worker, WorkerMachine) and isinstance(worker.handle, RemoteHandle)
    assert worker.policy is REMOTE and deployment.policy is REMOTE
    assert worker.handle.root_url == "http://gpu-2:8000" and worker.state is WorkerState.STOPPED
    waiting = Resident(deployment, ModelMemory()).progress_now()  # what a request waiting for it is told
    assert waiting.text.startswith("model 'r': waiting for its endpoint http://gpu-2:8000 to answer (")
    assert "loading" not in waiting.text and "worker" not in waiting.text
