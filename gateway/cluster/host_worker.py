"""HostWorker: a `gateway.lifecycle.workers.Worker` whose process runs on another host, started by that host's agent.

The gateway-side handle of a worker on a cluster host. `start()` asks the agent to start the worker with a
fresh launch secret, then mirrors the state the host's supervisor reports (polled every `interval_s`): the
agent restarts a crashed worker with the local rules, and this handle follows. `base_url()` is the URL the
agent reports; every request to it must carry `headers` (the launch secret). When the host is lost the
handle is FAILED with the host named (503 for requests) and stays so: re-placing the model elsewhere is the
lifecycle owner's decision, not this handle's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from backends.base import DeploymentPlan
from gateway.cluster.access import auth_headers, new_worker_token
from gateway.cluster.agent import HostAgent, HostLost, WorkerReport
from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.memory import ReportedProbe
from gateway.lifecycle.policy import Backoff
from gateway.lifecycle.workers import LOCAL_WORDING, WorkerStartError, WorkerState

log = logging.getLogger("voltgate.cluster")

POLL_INTERVAL_S = 2.0


class HostWorker:
    """One model's worker on `agent`'s host (see the module docstring; race semantics as
    `gateway.lifecycle.workers`)."""

    wording = LOCAL_WORDING  # a worker process the host's agent starts and restarts

    def __init__(
        self,
        plan: DeploymentPlan,
        agent: HostAgent,
        *,
        interval_s: float = POLL_INTERVAL_S,
        startup_s: float = 600.0,
        on_state: Callable[[str, WorkerState], None] | None = None,
        probe: ReportedProbe | None = None,
    ) -> None:
        self.name = plan.model
        self.host = agent.host
        self.state = WorkerState.STOPPED
        self.restarts = 0
        self.last_error: str | None = None
        self.backoff = Backoff()  # a failed load of an on-demand model, for the residency (the host restarts)
        self.pid: int | None = None
        self.lost: str | None = None  # why the host is gone, once it is
        self._plan, self._agent = plan, agent
        self._interval_s, self._startup_s = interval_s, startup_s
        self._token = new_worker_token()
        self.headers = auth_headers(self._token)
        self._url: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures = 0
        self._changed = asyncio.Event()
        self._on_state = on_state
        self._probe = probe  # where its host's measured use of this worker goes (the residency reads it)
        self._lost_signal: asyncio.Future[str] | None = None

    def start(self, *, retry: bool = False) -> None:
        del retry  # the host's supervisor decides restarts; a lost host is not retried here
        if self.lost is None and (self._task is None or self._task.done()):
            self._set(WorkerState.STARTING)
            self._task = asyncio.create_task(self._run(), name=f"host-worker:{self.host}:{self.name}")

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        with contextlib.suppress(WorkerStartError):
            await self.await_ready(timeout_s)
        return self.state is WorkerState.READY

    async def ensure_ready(self, timeout_s: float | None = None, *, retry: bool = False) -> None:
        failures = self._failures
        self.start(retry=retry)
        await self._await(failures, timeout_s)

    async def await_ready(self, timeout_s: float | None = None) -> None:
        await self._await(self._failures, timeout_s)

    def note_success(self) -> None:
        """The host's supervisor counts crash loops; nothing to do here."""

    def base_url(self) -> str:
        if self.state is WorkerState.READY and self._url is not None:
            return self._url
        if self.lost is not None:
            # retry soon: `voltgate serve --cluster` re-places the model within seconds when it fits elsewhere
            raise GatewayError(
                ErrorCode.WORKER_UNAVAILABLE, f"model {self.name!r} is unavailable: {self.lost}", retry_after_s=5
            )
        detail = f" (last error: {self.last_error})" if self.last_error else ""
        raise GatewayError(ErrorCode.WORKER_UNAVAILABLE,
                           f"model {self.name!r} is {self.state.value} on host {self.host!r}; retry shortly{detail}",
                           retry_after_s=5)  # fmt: skip

    def lost_signal(self) -> asyncio.Future[str]:
        """Resolves when the host is lost: a frozen or cut-off host closes no connection, so the calls in flight
        there are ended by the gateway (`gateway.serving.upstream`), not left to `upstream_timeout_s`."""
        if self._lost_signal is None:
            self._lost_signal = asyncio.get_running_loop().create_future()
            if self.lost is not None:
                self._lost_signal.set_result(self.lost)
        return self._lost_signal

    def connection_lost(self, cause: str) -> str:
        """What a client whose call broke is told (`gateway.lifecycle.workers.Worker.connection_lost`)."""
        return (
            f"model {self.name!r}: the connection to its worker on host {self.host!r} was lost ({cause}); "
            "if the host is gone, the model is re-placed on another host if one has room, else its requests "
            "get a 503 saying why; retry shortly"
        )

    async def stop(self, grace_s: float = 10.0) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.lost is None:
            with contextlib.suppress(HostLost):
                await self._agent.stop_worker(self.name, grace_s)
        self._url = None
        self._set(WorkerState.STOPPED)

    async def _await(self, failures: int, timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.state is not WorkerState.READY:
            if self.lost is not None or self._failures > failures:
                raise WorkerStartError(self.lost or self.last_error or "failed to start")
            if self.state is WorkerState.STOPPED:
                raise WorkerStartError("stopped before it was ready")
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerStartError(f"not ready after {timeout_s:.0f} s")
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    async def _run(self) -> None:
        try:
            self._mirror(await self._agent.start_worker(self._plan, self._token, self._startup_s))
            while True:
                await asyncio.sleep(self._interval_s)
                self._mirror(await self._agent.worker(self.name))
        except HostLost as exc:
            self.lost = self.last_error = str(exc)
            self._url = None
            log.error("worker %s: %s", self.name, exc)
            if self._lost_signal is not None and not self._lost_signal.done():
                self._lost_signal.set_result(self.lost)
            self._set(WorkerState.FAILED)

    def _mirror(self, report: WorkerReport) -> None:
        self._url, self.pid, self.restarts = report.url, report.pid, report.restarts
        self.last_error = report.last_error
        if self._probe is not None:
            self._probe.update_worker(report.pid, report.rss_bytes, report.gpu_bytes)
        self._set(report.state)

    def _set(self, state: WorkerState) -> None:
        if state is self.state:
            return
        self.state = state
        if state is WorkerState.FAILED:
            self._failures += 1
        self._changed.set()
        self._changed = asyncio.Event()
        log.info("worker %s on host %s: %s", self.name, self.host, state.value)
        if self._on_state is not None:
            self._on_state(self.name, state)
