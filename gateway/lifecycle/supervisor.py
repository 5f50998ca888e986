"""WorkerMachine: a model's worker states over a `WorkerHandle`, for pinned, on-demand and remote models alike.

The states and transitions are `gateway.lifecycle.workers.WorkerState`'s (drawn above it, every move checked
against `TRANSITIONS`); the crash-loop rule is in docs/lifecycle.md ("Backoff and crash loops"); the race
semantics of every method are those of `gateway.lifecycle.workers.Worker`. What
differs between a pinned, an on-demand and a remote model are values of its `Policy`: `restarts` (after a
failure, start again by itself once the `Backoff` ends; otherwise stay FAILED until the next `start()`),
`gives_up` (stop after a crash loop, or restart forever) and `backoff_max_s`. What a 503 calls the worker is
its handle's `Wording`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.policy import CRASH_LIMIT, HEALTHY_RESET_S, Backoff, Policy
from gateway.lifecycle.workers import (
    NO_HEADERS,
    IllegalTransition,
    Wording,
    WorkerHandle,
    WorkerStartError,
    WorkerState,
    restarted_message,
)

__all__ = ["NATIVE_CRASH_HINT", "WorkerMachine"]

log = logging.getLogger("voltgate.supervisor")

NATIVE_CRASH_HINT = (
    "a native crash in the engine: run `voltgate doctor`, which runs a real decode in a child process and "
    "checks the llama.cpp build against this CPU and GPU (docs/troubleshooting.md)"
)


class WorkerMachine:
    """One model's worker: a `gateway.lifecycle.workers.Worker` driving `handle`. All methods run on the event
    loop; none blocks it."""

    headers = NO_HEADERS

    def __init__(
        self,
        handle: WorkerHandle,
        policy: Policy,
        *,
        on_state: Callable[[str, WorkerState], None] | None = None,
        on_crash: Callable[[str, str], None] | None = None,
        healthy_reset_s: float = HEALTHY_RESET_S,
        crash_limit: int = CRASH_LIMIT,
    ) -> None:
        self.name = handle.name
        self.handle = handle
        self.policy = policy
        self._on_state = on_state
        self._on_crash = on_crash
        self._crash_limit = crash_limit
        self.state = WorkerState.STOPPED
        self.restarts = 0
        self.last_error: str | None = None
        self.gave_up: str | None = None  # why the worker is no longer started (a crash loop)
        self.backoff = Backoff(healthy_reset_s, policy.backoff_max_s)
        self._streak = 0  # failures since the last request served
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ready = asyncio.Event()
        self._failures = 0  # FAILED transitions so far: how `ensure_ready` tells "this start failed"
        self._changed = asyncio.Event()  # set (and replaced) on every state change
        self._ending = asyncio.Lock()  # held by `stop()` until its process is ended

    @property
    def pid(self) -> int | None:
        return self.handle.pid

    @property
    def wording(self) -> Wording:
        return self.handle.wording

    # -- public (the `Worker` protocol) -----------------------------------------------------------------
    def start(self, *, retry: bool = False) -> None:
        """Start the loop (first start plus restarts) in the background. A worker that gave up after a crash
        loop starts again only with `retry` (an admin load, a config reload)."""
        if retry and self.gave_up is not None:
            self.gave_up, self._streak = None, 0
            if self.policy.restarts:  # else a request's load restarts it, and `Residency` keeps its backoff
                self.backoff.reset()
        if self.gave_up is not None:
            return
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.create_task(self._run(), name=f"worker:{self.name}")

    def note_success(self) -> None:
        """A request was served: the failures before it were not a crash loop."""
        self._streak = 0

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self._ready.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def ensure_ready(self, timeout_s: float | None = None, *, retry: bool = False) -> None:
        failures = self._failures
        self.start(retry=retry)
        await self._await(failures, timeout_s)

    async def await_ready(self, timeout_s: float | None = None) -> None:
        await self._await(self._failures, timeout_s)

    def lost_signal(self) -> None:
        """None: a gone local worker is killed (a frozen one too), which closes its connections."""
        return None

    def connection_lost(self, cause: str) -> str:
        """The broken call's cause, and once the worker has ended (a crash, a freeze), how it ended."""
        ended = self.last_error if self.state is not WorkerState.READY and self.last_error else None
        return restarted_message(self.name, f"{cause}: {ended}" if ended else cause, self.handle.wording)

    def base_url(self) -> str:
        """The worker's URL when READY; otherwise a 503 with Retry-After saying why."""
        url = self.handle.url()
        if self.state is WorkerState.READY and url is not None:
            return url
        if self.state is WorkerState.STOPPING or self._stopping:
            raise GatewayError(ErrorCode.SHUTTING_DOWN, f"model {self.name!r} is shutting down", retry_after_s=30)
        if self.gave_up is not None:
            raise GatewayError(ErrorCode.WORKER_UNAVAILABLE, f"model {self.name!r} is failed: {self.gave_up}")
        retry = max(1.0, self.backoff.left_s() + 5.0) if self.backoff.waiting() else 5.0
        detail = f" (last error: {self.last_error})" if self.last_error and self.state is WorkerState.FAILED else ""
        words = self.handle.wording
        verb = words.loading if self.state is WorkerState.STARTING and self.restarts == 0 else words.restarting
        if self.state is WorkerState.FAILED:
            verb = words.unavailable + (f" and {words.retried}" if self.policy.restarts else "")
        elif self.state is WorkerState.STOPPED:
            verb = "is waiting to start"  # e.g. a pinned GPU model whose turn at boot has not come
        raise GatewayError(
            ErrorCode.WORKER_UNAVAILABLE, f"model {self.name!r} {verb}; retry shortly{detail}", retry_after_s=retry
        )

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop the loop and terminate the worker: SIGTERM, grace, SIGKILL (`WorkerHandle.terminate`)."""
        self._stopping = True
        async with self._ending:  # a start meanwhile waits for this stop's end (STOPPING -> STOPPED -> STARTING)
            if self._task is not None:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            await self._terminate(grace_s)
            self._set_state(WorkerState.STOPPED)

    # -- internals --------------------------------------------------------------------------------------
    async def _await(self, failures: int, timeout_s: float | None) -> None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.state is not WorkerState.READY:
            if self.gave_up is not None:
                raise WorkerStartError(self.gave_up)
            if self._failures > failures:
                raise WorkerStartError(self.last_error or "failed to start")
            if self._stopping:
                raise WorkerStartError("stopped before it was ready")
            changed = self._changed
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WorkerStartError(f"not ready after {timeout_s:.0f} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), left)

    def _set_state(self, state: WorkerState) -> None:
        """Move to `state` (staying put is no move); `IllegalTransition` for a move the diagram lacks."""
        if state is self.state:
            return
        if not self.state.can_become(state):
            raise IllegalTransition(self.state, state)
        self.state = state
        if state is WorkerState.READY:
            self._ready.set()
        else:
            self._ready.clear()
        if state is WorkerState.FAILED:
            self._failures += 1
        self._changed.set()
        self._changed = asyncio.Event()
        log.log(self._loudness(logging.INFO) if state is not WorkerState.READY else logging.INFO,
                "worker %s: %s", self.name, state.value)  # fmt: skip
        if self._on_state is not None:
            self._on_state(self.name, state)

    async def _run(self) -> None:
        """Start, serve until the worker ends, fail, and (when the policy restarts) wait the backoff and
        start again."""
        async with self._ending:  # a stop still ending the last process ends first: one process at a time
            pass
        while not self._stopping:
            ready_at: float | None = None
            grace_s = 2.0
            try:
                self._set_state(WorkerState.STARTING)
                await self.handle.launch()
                await self.handle.wait_healthy()
                self.last_error = None
                self._set_state(WorkerState.READY)
                ready_at = time.monotonic()
                ended = await self.handle.wait_exit()
                if self._stopping:
                    return
                cause, self.last_error, grace_s = ended.cause, ended.message, ended.grace_s
            except WorkerStartError as exc:
                cause, self.last_error = exc.cause, str(exc)
                log.log(self._loudness(logging.ERROR), "worker %s failed to start: %s", self.name, exc)
            await self._terminate(grace_s)
            if self._stopping:
                return
            if ready_at is not None and time.monotonic() - ready_at >= self.backoff.healthy_reset_s:
                self._streak = 0  # it served for a while: not a crash loop
            self._crashed(cause)
            if not self.policy.restarts:  # a request's load starts it again: `Residency` counts it in `backoff`
                self._set_state(WorkerState.FAILED)
                return
            self.backoff.served_for(None if ready_at is None else time.monotonic() - ready_at)
            delay = self.backoff.fail()
            self._set_state(WorkerState.FAILED)
            if self.gave_up is not None:
                return
            log.log(self._loudness(logging.WARNING), "worker %s: restarting in %.0f s", self.name, delay)
            await asyncio.sleep(delay)
            self.restarts += 1

    def _crashed(self, cause: str) -> None:
        """Count a failure; at `crash_limit` in a row with no request served, give up (docs/lifecycle.md)."""
        self._streak += 1
        if self._on_crash is not None:
            self._on_crash(self.name, cause)
        if self._streak < self._crash_limit:
            return
        if not self.policy.gives_up:  # restarted forever: say so once per streak, then quietly
            if self._streak == self._crash_limit:
                log.warning(
                    "worker %s: %d failures in a row (%s); it is retried every %.0f s at most until it serves, "
                    "further failures are logged at debug level", self.name, self._streak, cause,
                    self.backoff.max_s,
                )  # fmt: skip
            return
        native = cause.startswith("SIG") and cause not in ("SIGTERM", "SIGKILL", "SIGINT")
        hint = NATIVE_CRASH_HINT if native else "see the worker's log lines above"
        self.gave_up = (
            f"the worker failed {self._streak} times in a row with no request served between ({cause}; "
            f"last error: {self.last_error}); it is not restarted again until an admin load "
            f"(POST /admin/models/{self.name}/load) or a config reload. Likely cause: {hint}"
        )
        self.last_error = self.gave_up  # what /ready, /v1/models and /v1/placement show
        log.error("worker %s: %s", self.name, self.gave_up)

    def _loudness(self, level: int) -> int:
        """`level`, or debug past a streak of `crash_limit` failures under a policy that never gives up: a remote
        endpoint down for an hour logs its first failures, not one line every few seconds."""
        return logging.DEBUG if not self.policy.gives_up and self._streak >= self._crash_limit else level

    async def _terminate(self, grace_s: float) -> None:
        if self.handle.alive():
            self._set_state(WorkerState.STOPPING)
        await self.handle.terminate(grace_s)
