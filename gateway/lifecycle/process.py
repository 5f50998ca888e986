"""WorkerProcess: a `gateway.lifecycle.workers.WorkerHandle` for an engine process on this host.

Launch: a new process in its own process group (start_new_session), on a free port, its output relayed to
the log and kept as a tail; wait healthy: poll its health path until 200, failing at once on an exit or a
fatal log line, or at the startup timeout; wait exit: the process's end, or its freeze (no answer to a health
check for `frozen_after_s`: stopped with SIGSTOP, or hung in native code), whichever comes first; terminate:
SIGTERM and SIGCONT to the group, a grace period (none: at once), SIGKILL, then a backstop for anything the
worker spawned. Restarts, backoff and crash loops are not decided here
(docs/lifecycle.md).
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
from collections.abc import Callable, Sequence

import httpx

from backends.base import LaunchSpec
from gateway.lifecycle.workers import LOCAL_WORDING, WorkerExit, WorkerStartError

__all__ = ["WorkerProcess", "exit_cause", "pick_free_port"]

log = logging.getLogger("voltgate.supervisor")

LOG_TAIL_LINES = 40

FROZEN_AFTER_S = 30.0
"""A ready worker that answers no health check this long is frozen (`server.worker_frozen_s`)."""
LIVENESS_INTERVAL_S = 5.0
"""How often a ready worker's health is checked (each check waits this long at most)."""


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
    """One engine process at a time, launched from `spec_for_port` (the adapter's `LaunchSpec` for a port)."""

    wording = LOCAL_WORDING

    def __init__(
        self, name: str, spec_for_port: Callable[[int], LaunchSpec], *, client: httpx.AsyncClient,
        host: str = "127.0.0.1", frozen_after_s: float | None = FROZEN_AFTER_S,
    ) -> None:  # fmt: skip
        self.name = name
        self.frozen_after_s = frozen_after_s  # None: never declared frozen
        self._spec_for_port = spec_for_port
        self._client = client
        self._host = host
        self.pid: int | None = None
        self.port: int | None = None
        self.log_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL_LINES)
        self._proc: asyncio.subprocess.Process | None = None
        self._spec: LaunchSpec | None = None
        self._fatal_hit: asyncio.Future[str] | None = None
        self._log_task: asyncio.Task[None] | None = None

    def url(self) -> str | None:
        return None if self.port is None or self._proc is None else f"http://{self._host}:{self.port}"

    def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    def log_lines(self) -> Sequence[str]:
        return list(self.log_tail)

    async def launch(self) -> None:
        self.port = pick_free_port(self._host)
        spec = self._spec = self._spec_for_port(self.port)
        self.log_tail.clear()  # a failed start quotes this process's lines, never an earlier one's
        log.info("worker %s: starting %s", self.name, " ".join(spec.argv))
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *spec.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env={**os.environ, **spec.env},
                start_new_session=True,
                preexec_fn=_set_parent_death_signal,
            )
        except OSError as exc:
            raise WorkerStartError(f"cannot execute {spec.argv[0]!r}: {exc}", "cannot execute") from exc
        self.pid = self._proc.pid
        fatal = [re.compile(p) for p in spec.fatal_log_patterns]
        self._fatal_hit = asyncio.get_running_loop().create_future()
        self._log_task = asyncio.create_task(self._relay_logs(self._proc, fatal, self._fatal_hit))

    async def wait_healthy(self) -> None:
        proc, spec, fatal_hit = self._proc, self._spec, self._fatal_hit
        assert proc is not None and spec is not None and fatal_hit is not None, "wait_healthy() before launch()"
        deadline = time.monotonic() + spec.startup_timeout_s
        url = f"http://{self._host}:{self.port}{spec.health_path}"
        while True:
            if proc.returncode is not None:
                await asyncio.sleep(0.1)  # let the log relay drain the last lines
                code = proc.returncode
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
                    return
            await asyncio.sleep(0.25)

    async def wait_exit(self) -> WorkerExit:
        proc = self._proc
        if proc is None:
            return WorkerExit(exit_cause(-1), "worker exited with code -1")
        exited = asyncio.ensure_future(proc.wait())
        frozen = asyncio.ensure_future(self._watch_liveness())
        try:
            await asyncio.wait({exited, frozen}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            frozen.cancel()
            exited.cancel()
        if frozen.done() and not frozen.cancelled() and not exited.done():
            return frozen.result()
        returncode = proc.returncode if proc.returncode is not None else -1
        cause = exit_cause(returncode)
        log.error(
            "worker %s exited unexpectedly (code %s); last log lines:\n%s",
            self.name, returncode, "\n".join(list(self.log_tail)[-10:]),
        )  # fmt: skip
        return WorkerExit(cause, f"worker exited with code {returncode}" + (f" ({cause})" if returncode < 0 else ""))

    async def _watch_liveness(self) -> WorkerExit:
        """Return once the running worker has answered no health check for `frozen_after_s` (never, when that is
        None). Any answer is life, a 503 included (the worker's own word on its state); only silence counts: a
        process stopped with SIGSTOP, a host paused under it, a worker hung in native code. Its requests in
        flight would otherwise wait for `upstream_timeout_s`; the supervisor kills it, which ends them at once."""
        limit = self.frozen_after_s
        if limit is None or self._spec is None:
            await asyncio.Event().wait()  # never
        assert limit is not None and self._spec is not None
        url = f"http://{self._host}:{self.port}{self._spec.health_path}"
        interval = min(LIVENESS_INTERVAL_S, limit / 3)
        loop = asyncio.get_running_loop()
        answered = loop.time()
        while True:
            await asyncio.sleep(interval)
            try:
                await self._client.get(url, timeout=interval)
                answered = loop.time()
            except httpx.HTTPError as exc:
                silent = loop.time() - answered
                if silent >= limit:
                    log.error("worker %s answered no health check for %.0f s (%s): frozen; it is killed and "
                              "restarted", self.name, silent, type(exc).__name__)  # fmt: skip
                    return WorkerExit("frozen", f"worker answered no health check for {silent:.0f} s (stopped or "
                                      "hung); it was killed", grace_s=0.0)  # fmt: skip

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

    async def terminate(self, grace_s: float) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None and grace_s > 0:
            _signal_group(proc.pid, signal.SIGTERM)
            _signal_group(proc.pid, signal.SIGCONT)  # a stopped worker (SIGSTOP) acts on the SIGTERM
            try:
                await asyncio.wait_for(proc.wait(), grace_s)
            except TimeoutError:
                log.warning("worker %s ignored SIGTERM for %.0f s; sending SIGKILL", self.name, grace_s)
                _signal_group(proc.pid, signal.SIGKILL)
                await proc.wait()
        # No grace, or the backstop: anything the worker spawned into its group that outlived it; wait until
        # it is gone.
        _signal_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        for _ in range(50):
            if not _group_alive(proc.pid):
                break
            await asyncio.sleep(0.02)
        if self._proc is proc:
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
