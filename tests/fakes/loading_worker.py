"""FakeLoadingWorker: an in-process `gateway.lifecycle.workers.Worker` whose start takes time and may fail.

Stands for a `gateway.lifecycle.supervisor.WorkerMachine` with the on-demand policy (it does not restart itself) in
unit tests of `gateway.lifecycle.residency`: `start()` begins a load of `load_s` seconds that ends READY, or FAILED
with `fail` as its last error; it counts starts and stops so a test can check that concurrent requests
caused one load and that a model with requests in flight was never stopped. Requests reach it through
`tests.fakes.asgi_worker.BASE_URL` (an ASGI fake engine), like `FakeWorker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.policy import Backoff
from gateway.lifecycle.workers import LOCAL_WORDING, NO_HEADERS, WorkerStartError, WorkerState, restarted_message
from tests.fakes.asgi_worker import BASE_URL


class FakeLoadingWorker:
    wording = LOCAL_WORDING

    def __init__(
        self,
        name: str,
        *,
        load_s: float = 0.02,
        fail: str | None = None,
        on_state: Callable[[str, WorkerState], None] | None = None,
    ) -> None:
        self.name = name
        self.load_s = load_s
        self.fail = fail
        self.on_state = on_state
        self.state = WorkerState.STOPPED
        self.restarts = 0
        self.last_error: str | None = None
        self.backoff = Backoff()  # counted by the residency: a fake never restarts itself
        self.pid: int | None = None
        self.starts = 0
        self.stops = 0
        self.stopped_at: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    def _set(self, state: WorkerState) -> None:
        self.state = state
        self._changed.set()
        self._changed = asyncio.Event()
        if self.on_state is not None:
            self.on_state(self.name, state)

    def start(self, *, retry: bool = False) -> None:
        del retry
        if self.state in (WorkerState.STOPPED, WorkerState.FAILED):
            self.starts += 1
            self._set(WorkerState.STARTING)
            self._task = asyncio.create_task(self._load())

    async def _load(self) -> None:
        await asyncio.sleep(self.load_s)
        if self.fail is not None:
            self.last_error = self.fail
            self._set(WorkerState.FAILED)
        else:
            self.last_error = None
            self._set(WorkerState.READY)

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.ensure_ready(), timeout_s)
        return self.state is WorkerState.READY

    async def ensure_ready(self, timeout_s: float | None = None, *, retry: bool = False) -> None:
        self.start(retry=retry)
        await self.await_ready(timeout_s)

    async def await_ready(self, timeout_s: float | None = None) -> None:
        while self.state is WorkerState.STARTING:
            await asyncio.wait_for(self._changed.wait(), timeout_s)
        if self.state is not WorkerState.READY:
            raise WorkerStartError(self.last_error or f"worker {self.state.value}")

    def note_success(self) -> None:
        """Requests served do not change a fake's state."""

    headers = NO_HEADERS

    def lost_signal(self) -> None:
        return None

    def connection_lost(self, cause: str) -> str:
        return restarted_message(self.name, cause)

    def base_url(self) -> str:
        if self.state is WorkerState.READY:
            return BASE_URL
        raise GatewayError(ErrorCode.WORKER_UNAVAILABLE, f"model {self.name!r} is {self.state.value}", retry_after_s=5)

    def crash(self, reason: str = "worker exited with code -9") -> None:
        """Die while serving, as an OOM-killed process would."""
        self.last_error = reason
        self._set(WorkerState.FAILED)

    async def stop(self, grace_s: float = 10.0) -> None:
        del grace_s
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.stops += 1
        self.stopped_at.append(time.monotonic())
        if self.state is not WorkerState.STOPPED:
            self._set(WorkerState.STOPPED)
