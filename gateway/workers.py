"""The one interface the gateway has to a model's worker, whatever runs it.

Three things implement `Worker`: `gateway.supervisor.WorkerProcess` (a local engine process it starts and
restarts), `gateway.remote.RemoteEndpoint` (an OpenAI endpoint on another host, health-checked) and the
test double `tests.fakes.asgi_worker.FakeWorker` (an in-process ASGI app). The service layer and the
routes only ever call what is declared here.

    STOPPED ─start()─▶ STARTING ─ready─▶ READY ─crash / unhealthy─▶ FAILED ─retry─▶ STARTING
       ▲                                   │                          │
       └────────────── stop() (from any state, through STOPPING) ─────┘

Race semantics, as llama-swap documents its `Process`:
* `base_url()` decides inside the state machine: callers never read `state` to decide whether to send.
  It answers the URL only while READY, and otherwise raises the right 503 `GatewayError` (with
  Retry-After) at once; it never waits. A URL handed out may still fail a moment later (the worker crashed
  in between): the caller treats the transport error as a 503 for that one request.
* `start()` is idempotent and returns at once: the first call begins loading in the background, later
  calls (while it loads or runs) do nothing.
* `wait_ready()` waits for READY without changing anything; a timeout is not an error, it returns False.
* `await_ready()` waits for the outcome of a start already under way (a pinned model booting or being
  restarted by its supervisor) without starting one: a request that arrives then waits instead of a 503.
* `note_success()` marks a served request: a worker that crashes `crash_limit` times in a row with none
  served between gives up (FAILED with the cause) instead of restarting forever.
* `ensure_ready()` is llama-swap's EnsureReady: it starts the worker if it is not running and waits for
  the outcome of that start (READY, or the failure with its reason, or the timeout), deciding inside the
  state machine: READY returns at once, a start in progress is joined, a stop in progress is not (it
  raises). Callers that need the worker serving use it instead of reading `state` and calling `start()`.
* `stop()` is safe in every state, concurrently with `start()` and with requests in flight, and
  idempotent. After it returns, `base_url()` raises (503 shutting down) until the next `start()`.
* `state` is for display (/health, /v1/models, metrics), never a precondition.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Protocol


class WorkerStartError(Exception):
    """A worker exited, timed out or logged a fatal line while starting; the message carries its last log lines
    and `cause` what ended it (`SIGSEGV`, `exit 1`, `timeout`, `fatal log line`)."""

    def __init__(self, message: str, cause: str = "start failed") -> None:
        super().__init__(message)
        self.cause = cause


class WorkerState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"


class Worker(Protocol):
    """A model's worker as the gateway sees it; see the module docstring for the race semantics."""

    name: str
    state: WorkerState
    restarts: int
    last_error: str | None
    pid: int | None

    def start(self, *, retry: bool = False) -> None:
        """Begin (or keep) serving in the background; idempotent, never blocks. `retry` also restarts a
        worker that gave up after a crash loop."""
        ...

    async def wait_ready(self, timeout_s: float | None = None) -> bool:
        """True once READY; False after `timeout_s`. Changes nothing."""
        ...

    async def ensure_ready(self, timeout_s: float | None = None, *, retry: bool = False) -> None:
        """Start if needed (with `retry`, also after a crash loop) and wait until READY; raise
        `WorkerStartError` with the reason when this start fails, when it is not ready within `timeout_s`,
        or when the worker is stopped meanwhile."""
        ...

    async def await_ready(self, timeout_s: float | None = None) -> None:
        """Wait until READY without starting anything; raise `WorkerStartError` like `ensure_ready`."""
        ...

    def note_success(self) -> None:
        """A request was served through this worker (ends a crash-loop streak)."""
        ...

    def base_url(self) -> str:
        """The root URL to send a request to while READY; otherwise raises a 503 `GatewayError`."""
        ...

    async def stop(self, grace_s: float = 10.0) -> None:
        """Stop serving (terminating any process); safe in every state and idempotent."""
        ...


def request_headers(worker: Worker) -> Mapping[str, str]:
    """The headers every call to `worker` must carry: a cluster worker's launch secret
    (`gateway.cluster.host_worker.HostWorker.headers`); none for the other workers."""
    headers = getattr(worker, "headers", None)
    return headers if isinstance(headers, Mapping) else {}
