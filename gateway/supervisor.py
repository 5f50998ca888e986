"""Worker processes: one state machine shared by every engine, and the Supervisor that owns them all.

    STOPPED ─start()─▶ STARTING ─health 200─▶ READY
        ▲                 │ exit / timeout /     │ unexpected exit
        │                 ▼ fatal log line       ▼
        └──stop()──── STOPPING ◀──stop()──── FAILED ─backoff─▶ STARTING

A worker runs in its own process group (start_new_session) so stop() can signal everything it spawned:
SIGTERM to the group, a grace period, then SIGKILL. Unexpected exits and failed starts restart with
exponential backoff, 1 s doubling to 60 s, so an OOM crash loop cannot spin. A worker that had been READY
for `healthy_reset_s` (30 s by default) when it died starts again from 1 s: a crash after a while of
serving is a new incident, not part of a loop. That healthy time counts from READY, not from launch, so a
model that loads for minutes and dies as soon as it is up keeps backing off.

With `restart=False` (models loaded on demand, whose lifecycle `gateway.residency` owns) a failed start or
an unexpected exit leaves the worker FAILED: the next `start()` or `ensure_ready()` tries again.

A crash loop is not retried forever in silence: after `crash_limit` (3) failures in a row with no
request served between them (`note_success()`, or `healthy_reset_s` of READY, ends a streak), the worker
gives up. It stays FAILED with the cause (the signal, e.g. SIGSEGV, and what to do), `base_url()` answers a
503 naming it, and only an explicit `start(retry=True)` (an admin load, a config reload) tries again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable

import httpx

from backends.base import LaunchSpec
from gateway.errors import ErrorCode, GatewayError
from gateway.workers import WorkerStartError, WorkerState

__all__ = ["WorkerProcess", "WorkerStartError", "WorkerState", "pick_free_port"]

log = logging.getLogger("voltgate.supervisor")

CRASH_LIMIT = 3
"""Failures in a row, with no request served between them, after which a worker is not restarted."""
NATIVE_CRASH_HINT = (
    "a native crash in the engine: run `voltgate doctor`, which runs a real decode in a child process and "
    "checks the llama.cpp build against this CPU and GPU (docs/troubleshooting.md)"
)
BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 60.0
HEALTHY_RESET_S = 30.0
"""Default `healthy_reset_s`: READY this long before a crash, and the next restart waits BACKOFF_INITIAL_S."""
LOG_TAIL_LINES = 40


def pick_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def exit_cause(returncode: int | None) -> str:
    """`SIGSEGV` for a process killed by a signal, `exit 3` for one that exited, `no exit` otherwise."""
    if returncode is None:
        return "no exit"
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit {returncode}"


def _set_parent_death_signal() -> None:
    """Runs in the child before exec: die with the gateway even if the gateway is SIGKILLed (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class WorkerProcess:
    """One supervised worker process: a `gateway.workers.Worker` (whose docstring states the race
    semantics). All methods run on the event loop; none blocks it."""

    def __init__(
        self,
        name: str,
        spec_for_port: Callable[[int], LaunchSpec],
        *,
        client: httpx.AsyncClient,
        host: str = "127.0.0.1",
        on_state: Callable[[str, WorkerState], None] | None = None,
        healthy_reset_s: float = HEALTHY_RESET_S,
        restart: bool = True,
        crash_limit: int = CRASH_LIMIT,
        on_crash: Callable[[str, str], None] | None = None,
    ) -> None:
        self.name = name
        self._spec_for_port = spec_for_port
        self._client = client
        self._host = host
        self._on_state = on_state
        self.state = WorkerState.STOPPED
        self.restarts = 0
        self.last_error: str | None = None
        self.pid: int | None = None
        self.port: int | None = None
        self.log_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._ready = asyncio.Event()
        self._backoff_s = BACKOFF_INITIAL_S
        self._healthy_reset_s = healthy_reset_s
        self._next_start_at: float | None = None
        self._log_task: asyncio.Task[None] | None = None
        self._restart = restart
        self._failures = 0  # FAILED transitions so far: how `ensure_ready` tells "this start failed"
        self._changed = asyncio.Event()  # set (and replaced) on every state change
        self._crash_limit = crash_limit
        self._on_crash = on_crash
        self._streak = 0  # failures since the last request served
        self.gave_up: str | None = None  # why the worker is no longer restarted (a crash loop)

    # -- public -----------------------------------------------------------------------------------------
    def start(self, *, retry: bool = False) -> None:
        """Start the supervision loop (first launch plus restarts) in the background. A worker that gave up
        after a crash loop starts again only with `retry` (an admin load, a config reload)."""
        if retry and self.gave_up is not None:
            self.gave_up, self._streak, self._backoff_s = None, 0, BACKOFF_INITIAL_S
        if self.gave_up is not None:
            return
        if self._task is None or self._task.done():
            self._stopping = False
            self._task = asyncio.create_task(self._supervise(), name=f"worker:{self.name}")

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
        """Start unless running, then wait for READY; raise `WorkerStartError` if this start fails (the
        supervisor may still retry it, with backoff, when `restart` is on), times out or is stopped."""
        failures = self._failures
        self.start(retry=retry)
        await self._await(failures, timeout_s)

    async def await_ready(self, timeout_s: float | None = None) -> None:
        """Wait for READY without starting anything (a pinned model booting or restarting); raise
        `WorkerStartError` when its next start fails, it gives up, it is stopped, or after `timeout_s`."""
        await self._await(self._failures, timeout_s)

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

    def base_url(self) -> str:
        """The worker's URL when READY; otherwise a 503 with Retry-After saying why."""
        if self.state is WorkerState.READY and self.port is not None:
            return f"http://{self._host}:{self.port}"
        if self.state is WorkerState.STOPPING or self._stopping:
            raise GatewayError(ErrorCode.SHUTTING_DOWN, f"model {self.name!r} is shutting down", retry_after_s=30)
        retry = 5.0
        if self._next_start_at is not None:
            retry = max(1.0, self._next_start_at - time.monotonic() + 5.0)
        if self.gave_up is not None:
            raise GatewayError(ErrorCode.WORKER_UNAVAILABLE, f"model {self.name!r} is failed: {self.gave_up}")
        detail = f" (last error: {self.last_error})" if self.last_error and self.state is WorkerState.FAILED else ""
        verb = "is loading" if self.state is WorkerState.STARTING and self.restarts == 0 else "is restarting"
        if self.state is WorkerState.FAILED:
            verb = "is unavailable" + (" and will be restarted" if self._restart else "")
        elif self.state is WorkerState.STOPPED:
            verb = "is waiting to start"  # e.g. a pinned GPU model whose turn at boot has not come
        raise GatewayError(
            ErrorCode.WORKER_UNAVAILABLE,
            f"model {self.name!r} {verb}; retry shortly{detail}",
            retry_after_s=retry,
        )

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop supervising and terminate the process group: SIGTERM, grace, SIGKILL."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._terminate(grace_s)
        self._set_state(WorkerState.STOPPED)

    # -- internals --------------------------------------------------------------------------------------
    def _set_state(self, state: WorkerState) -> None:
        if state is self.state:
            return
        self.state = state
        if state is WorkerState.READY:
            self._ready.set()
        else:
            self._ready.clear()
        if state is WorkerState.FAILED:
            self._failures += 1
        self._changed.set()
        self._changed = asyncio.Event()
        log.info("worker %s: %s", self.name, state.value)
        if self._on_state is not None:
            self._on_state(self.name, state)

    async def _supervise(self) -> None:
        while not self._stopping:
            ready_at: float | None = None
            try:
                await self._launch_and_wait_ready()
                ready_at = time.monotonic()
                returncode = await self._proc.wait() if self._proc else -1
                if self._stopping:
                    return
                cause = exit_cause(returncode)
                self.last_error = f"worker exited with code {returncode}" + (f" ({cause})" if returncode < 0 else "")
                log.error(
                    "worker %s exited unexpectedly (code %s); last log lines:\n%s",
                    self.name,
                    returncode,
                    "\n".join(list(self.log_tail)[-10:]),
                )
            except WorkerStartError as exc:
                cause = exc.cause
                self.last_error = str(exc)
                log.error("worker %s failed to start: %s", self.name, exc)
            await self._terminate(grace_s=2.0)
            if self._stopping:
                return
            if ready_at is not None and time.monotonic() - ready_at >= self._healthy_reset_s:
                self._backoff_s, self._streak = BACKOFF_INITIAL_S, 0  # it served for a while: not a crash loop
            self._crashed(cause)
            self._set_state(WorkerState.FAILED)
            if not self._restart or self.gave_up is not None:
                return
            delay = self._backoff_s
            self._backoff_s = min(BACKOFF_MAX_S, self._backoff_s * 2)
            self._next_start_at = time.monotonic() + delay
            log.warning("worker %s: restarting in %.0f s", self.name, delay)
            await asyncio.sleep(delay)
            self._next_start_at = None
            self.restarts += 1

    def _crashed(self, cause: str) -> None:
        """Count a failure; at `crash_limit` in a row with no request served, give up (see the docstring)."""
        self._streak += 1
        if self._on_crash is not None:
            self._on_crash(self.name, cause)
        if self._streak < self._crash_limit:
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

    async def _launch_and_wait_ready(self) -> None:
        self.port = pick_free_port(self._host)
        spec = self._spec_for_port(self.port)
        self.log_tail.clear()  # a failed start quotes this process's lines, never an earlier one's
        self._set_state(WorkerState.STARTING)
        env = {**os.environ, **spec.env}
        log.info("worker %s: starting %s", self.name, " ".join(spec.argv))
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_set_parent_death_signal,
            )
        except OSError as exc:
            raise WorkerStartError(f"cannot execute {spec.argv[0]!r}: {exc}", "cannot execute") from exc
        self.pid = self._proc.pid
        fatal = [re.compile(p) for p in spec.fatal_log_patterns]
        fatal_hit: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self._log_task = asyncio.create_task(self._relay_logs(self._proc, fatal, fatal_hit))
        deadline = time.monotonic() + spec.startup_timeout_s
        url = f"http://{self._host}:{self.port}{spec.health_path}"
        while True:
            if self._proc.returncode is not None:
                await asyncio.sleep(0.1)  # let the log relay drain the last lines
                code = self._proc.returncode
                cause = exit_cause(code)
                raise WorkerStartError(
                    f"exited with code {code}{f' ({cause})' if code < 0 else ''} during start{self._tail()}", cause
                )
            if fatal_hit.done():
                raise WorkerStartError(
                    f"fatal log line during start: {fatal_hit.result()!r}{self._tail()}", "fatal log line"
                )
            if time.monotonic() > deadline:
                raise WorkerStartError(f"not ready after {spec.startup_timeout_s:.0f} s{self._tail()}", "timeout")
            with contextlib.suppress(httpx.HTTPError):
                response = await self._client.get(url, timeout=2.0)
                if response.status_code == 200:
                    break
            await asyncio.sleep(0.25)
        self.last_error = None
        self._set_state(WorkerState.READY)

    def _tail(self, lines: int = 8) -> str:
        tail = list(self.log_tail)[-lines:]
        return ("; last log lines:\n  " + "\n  ".join(tail)) if tail else ""

    async def _relay_logs(
        self, proc: asyncio.subprocess.Process, fatal: list[re.Pattern[str]], fatal_hit: asyncio.Future[str]
    ) -> None:
        worker_log = logging.getLogger(f"voltgate.worker.{self.name}")
        assert proc.stdout is not None
        async for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            if not line:
                continue
            if proc is self._proc:  # a replaced process still draining its pipe says nothing about the new one
                self.log_tail.append(line)
            worker_log.info("%s", line)
            if not fatal_hit.done() and any(p.search(line) for p in fatal):
                fatal_hit.set_result(line)

    async def _terminate(self, grace_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            self._set_state(WorkerState.STOPPING)
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("worker %s ignored SIGTERM for %.0f s; sending SIGKILL", self.name, grace_s)
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        # Backstop: anything the worker spawned into its group that outlived it, and wait until it is gone.
        _signal_group(proc.pid, signal.SIGKILL)
        for _ in range(50):
            if not _group_alive(proc.pid):
                break
            await asyncio.sleep(0.02)
        self._proc = None
        self.pid = None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
