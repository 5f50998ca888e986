"""RemoteEndpoint: a `gateway.lifecycle.workers.Worker` for an endpoint on another host, kept READY by health checks.

It owns no process; the registry, the service and /ready treat it like a local worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

import httpx

from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.workers import NO_HEADERS, WorkerStartError, WorkerState

log = logging.getLogger("voltgate.remote")

HEALTH_INTERVAL_S = 5.0


class RemoteEndpoint:
    """Polls `<root>/v1/models`; READY while it answers 200, FAILED (503 for requests) while it does not."""

    headers = NO_HEADERS

    def __init__(
        self,
        name: str,
        root_url: str,
        *,
        client: httpx.AsyncClient,
        on_state: Callable[[str, WorkerState], None] | None = None,
        interval_s: float = HEALTH_INTERVAL_S,
    ) -> None:
        self.name = name
        self.root_url = root_url.rstrip("/")
        self._client = client
        self._on_state = on_state
        self._interval_s = interval_s
        self.state = WorkerState.STOPPED
        self.restarts = 0
        self.last_error: str | None = None
        self.pid: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    def start(self, *, retry: bool = False) -> None:
        del retry  # a remote endpoint is health-checked until it answers; it never gives up
        if self._task is None or self._task.done():
            self._set_state(WorkerState.STARTING)
            self._task = asyncio.create_task(self._watch(), name=f"remote:{self.name}")

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def ensure_ready(self, timeout_s: float | None = None, *, retry: bool = False) -> None:
        self.start(retry=retry)
        if not await self.wait_ready(timeout_s):
            raise WorkerStartError(f"endpoint {self.root_url} not answering: {self.last_error or 'no answer yet'}")

    async def await_ready(self, timeout_s: float | None = None) -> None:
        if not await self.wait_ready(timeout_s):
            raise WorkerStartError(f"endpoint {self.root_url} not answering: {self.last_error or 'no answer yet'}")

    def note_success(self) -> None:
        """Health checks, not requests, decide a remote endpoint's state."""

    def connection_lost(self, cause: str) -> str:
        return f"model {self.name!r}: the connection to its endpoint {self.root_url} was lost ({cause})"

    def base_url(self) -> str:
        if self.state is WorkerState.READY:
            return self.root_url
        detail = f": {self.last_error}" if self.last_error else ""
        raise GatewayError(
            ErrorCode.WORKER_UNAVAILABLE,
            f"model {self.name!r}: its endpoint is not answering{detail}",
            retry_after_s=10,
        )

    async def stop(self, grace_s: float = 0.0) -> None:
        del grace_s
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._set_state(WorkerState.STOPPED)

    def _set_state(self, state: WorkerState) -> None:
        if state is self.state:
            return
        self.state = state
        if state is WorkerState.READY:
            self._ready.set()
        else:
            self._ready.clear()
        log.info("remote %s (%s): %s", self.name, self.root_url, state.value)
        if self._on_state is not None:
            self._on_state(self.name, state)

    async def _watch(self) -> None:
        while True:
            try:
                response = await self._client.get(self.root_url + "/v1/models", timeout=5.0)
                healthy = response.status_code == 200
                self.last_error = None if healthy else f"GET /v1/models answered {response.status_code}"
            except httpx.HTTPError as exc:
                healthy, self.last_error = False, f"{type(exc).__name__}: {exc}"
            if healthy:
                self._set_state(WorkerState.READY)
            elif self.state is WorkerState.READY:
                self.restarts += 1
                self._set_state(WorkerState.FAILED)
            await asyncio.sleep(self._interval_s if healthy else min(self._interval_s, 1.0))
