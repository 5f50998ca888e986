"""Child processes for benches: started in their own session, pinned with `taskset`, stopped group-wide.

`ManagedProcess.stop` does SIGTERM to the process group → grace → SIGKILL, so a gateway takes its
workers down with it. CPU time is read from psutil (`cpu_times()` of one PID, children excluded).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent


class ProcessFailedError(RuntimeError):
    """A child exited or never became ready; the message carries the tail of its log."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def taskset_prefix(cpus: str | None) -> list[str]:
    """`taskset -c CPUS` when pinning was asked for and is possible (Linux with util-linux), else nothing."""
    if cpus is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", cpus]


def pin_all_threads(pid: int, cpus: str) -> None:
    """Move every thread of a running process onto `cpus` (taskset -a: threads created later inherit it)."""
    if shutil.which("taskset") is None:
        return
    subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], check=True, capture_output=True)


def pin_self(cpus: set[int]) -> None:
    """Pin this process (the load generator) — the same as running it under taskset."""
    os.sched_setaffinity(0, cpus)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of `pid` itself (not its children)."""
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


class ManagedProcess:
    """One child process for the duration of a bench; use as a context manager."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_dir: Path,
        cpus: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = [*taskset_prefix(cpus), *argv]
        self.cpus = cpus
        self.log_path = log_dir / f"{name}.log"
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self._popen is not None, "not started"
        return self._popen.pid

    def start(self) -> ManagedProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self._popen = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=self._env, start_new_session=True
            )
        return self

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def wait_http(self, url: str, timeout_s: float = 120.0, headers: dict[str, str] | None = None) -> None:
        """Poll `url` until it answers 200; raise `ProcessFailedError` if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                if self._popen is not None and self._popen.poll() is not None:
                    raise ProcessFailedError(
                        f"{self.name} exited with {self._popen.returncode} before {url} was ready:\n{self.log_tail()}"
                    )
                try:
                    if client.get(url, headers=headers).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ProcessFailedError(
                        f"{self.name}: {url} not ready after {timeout_s:.0f} s:\n{self.log_tail()}"
                    )
                time.sleep(0.2)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to the process group, wait `grace_s`, then SIGKILL the group."""
        if self._popen is None or self._popen.poll() is not None:
            return
        # Descendants in sessions of their own (a gateway's workers) are not in our group: note them now.
        try:
            descendants = psutil.Process(self._popen.pid).children(recursive=True)
        except psutil.Error:
            descendants = []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, signal.SIGTERM)
        try:
            self._popen.wait(grace_s)
        except subprocess.TimeoutExpired:
            print(f"{self.name} ignored SIGTERM for {grace_s:.0f} s; killing it", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._popen.pid, signal.SIGKILL)
        self._popen.wait()
        _, alive = psutil.wait_procs(descendants, timeout=grace_s)
        for proc in alive:  # a worker its gateway did not take down
            with contextlib.suppress(psutil.Error):
                proc.kill()

    def __enter__(self) -> ManagedProcess:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.stop()


def find_worker(gateway_pid: int, module: str = "backends.llamacpp.worker") -> tuple[int, int]:
    """The (pid, port) of the worker a gateway started: a descendant whose command line runs `module`."""
    for child in psutil.Process(gateway_pid).children(recursive=True):
        try:
            cmdline = child.cmdline()
        except psutil.Error:
            continue
        if module in cmdline:
            joined = " ".join(cmdline)
            match = re.search(r"--port[ =](\d+)", joined)
            if match:
                return child.pid, int(match.group(1))
    raise ProcessFailedError(f"no {module} process under gateway pid {gateway_pid}")


def python() -> str:
    """The interpreter running the bench (the project's venv), for children."""
    return sys.executable
