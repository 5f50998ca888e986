"""One llama.cpp worker process for a test: started on a free loopback port, waited for, stopped (the one
harness the worker tests share instead of each its own copy)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.conftest import REPO, free_port

MODEL = "smollm2-test"
"""The name a test worker serves its model under, unless the test names another."""


def start_worker(model: Path, log_path: Path, *extra: str, name: str = MODEL) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m backends.llamacpp.worker` on `model` with `extra` arguments, its output in `log_path`; the
    process and its base URL (it may still be loading)."""
    port = free_port()
    argv = [
        sys.executable, "-m", "backends.llamacpp.worker",
        "--model", str(model), "--model-name", name, "--host", "127.0.0.1", "--port", str(port),
        *extra,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    return process, f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def wait_ready(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout_s: float = 60.0) -> None:
    """Until /health answers 200; before that only 503 (still loading) or no answer yet, and the process lives."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert process.poll() is None, f"worker exited with {process.returncode}:\n{log_path.read_text()}"
        with contextlib.suppress(httpx.TransportError):
            status = httpx.get(f"{url}/health", timeout=2).status_code
            if status == 200:
                return
            assert status == 503, f"/health answered {status} while loading:\n{log_path.read_text()}"
        assert time.monotonic() < deadline, f"worker not healthy within {timeout_s:.0f} s"
        time.sleep(0.05)


@contextlib.contextmanager
def running_worker(
    model: Path, log_path: Path, *extra: str, name: str = MODEL, ready_s: float = 60.0
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A started worker, ready within `ready_s`, stopped when the block ends (its process and base URL)."""
    process, url = start_worker(model, log_path, *extra, name=name)
    try:
        wait_ready(url, process, log_path, ready_s)
        yield process, url
    finally:
        stop(process)
