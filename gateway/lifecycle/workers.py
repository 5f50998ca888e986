"""A model's one state, `WorkerState` (its diagram drawn above it, its moves in `TRANSITIONS`), and the two
interfaces of a model's worker: `Worker`, what the request path and the views call, and `WorkerHandle`, what
the lifecycle drives to run one (docs/lifecycle.md: the policies and the contracts).

`Worker` is implemented by `gateway.lifecycle.supervisor.WorkerMachine` (a model's state machine over a
`WorkerHandle`), `gateway.cluster.host_worker.HostWorker` (a mirror of a cluster host's own machine) and the test
double `tests.fakes.asgi_worker.FakeWorker`. `WorkerHandle` is implemented by
`gateway.lifecycle.process.WorkerProcess` (a local engine process) and `gateway.lifecycle.remote.RemoteHandle`
(an OpenAI endpoint on another host: nothing to start, health-checked).

Race semantics of `Worker`, as llama-swap documents its `Process`:
* `base_url()` decides inside the state machine: callers never read `state` to decide whether to send.
  It answers the URL only while READY, and otherwise raises the right 503 `GatewayError` (with
  Retry-After) at once; it never waits. A URL handed out may still fail a moment later (the worker crashed
  in between): the caller treats the transport error as a 503 for that one request.
* `start()` is idempotent and returns at once: the first call begins loading in the background, later
  calls (while it loads or runs) do nothing.
* `wait_ready()` waits for READY without changing anything; a timeout is not an error, it returns False.
* `await_ready()` waits for the outcome of a start already under way (a pinned model booting or being
  restarted) without starting one: a request that arrives then waits instead of a 503.
* `note_success()` marks a served request: a worker that crashes `CRASH_LIMIT` times in a row with none
  served between gives up (FAILED with the cause) instead of restarting forever, unless its policy never
  gives up (a remote endpoint).
* `ensure_ready()` is llama-swap's EnsureReady: it starts the worker if it is not running and waits for
  the outcome of that start (READY, or the failure with its reason, or the timeout), deciding inside the
  state machine: READY returns at once, a start in progress is joined, a stop in progress is not (it
  raises). Callers that need the worker serving use it instead of reading `state` and calling `start()`.
* `stop()` is safe in every state, concurrently with `start()` and with requests in flight, and
  idempotent. After it returns, `base_url()` raises (503 shutting down) until the next `start()`.
* `state` is for display (/health, /v1/models, metrics), never a precondition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol

from gateway.lifecycle.policy import Backoff


class WorkerStartError(Exception):
    """A worker exited, timed out or logged a fatal line while starting; the message carries its last log lines
    and `cause` what ended it (`SIGSEGV`, `exit 1`, `timeout`, `fatal log line`)."""

    def __init__(self, message: str, cause: str = "start failed") -> None:
        super().__init__(message)
        self.cause = cause


class Status(StrEnum):
    """The word a model's state is shown by in /v1/models (`status`), /ready (`status`), /admin/models (`state`),
    the status page and `voltgate:model_state`: a vocabulary, not a state. It is never stored or changed: it is
    `WorkerState.status`, or the scheduler's step on the model (`gateway.lifecycle.resident.Resident.status`)."""

    UNLOADED = "unloaded"
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    FAILED = "failed"


# A model's worker: the one state machine of a model; its events are `WorkerMachine`'s
# (`gateway.lifecycle.supervisor`). A state is named as /health, /ready's `state` and `voltgate:worker_state`
# show it; in brackets, its `Status`, as /v1/models shows the model. docs/lifecycle.md adds the policies.
#
#                start()                    healthy
#   STOPPED ────────────────▶ STARTING ────────────────▶ READY
#   (unloaded)                (loading)                  (ready)
#     ▲   ▲                    │     ▲                    │   │
#     │   │       start failed │     │ the backoff ended  │   │ stop(); or it froze
#     │   │        (it exited) │     │ (policy restarts), │   │ (its process alive)
#     │   │                    ▼     │ or start()         │   ▼
#     │   │   stop()          FAILED ┘                    │  STOPPING ◀── stop() of STARTING, or
#     │   └────────────────── (failed) ◀──────────────────┘  (draining)    its start failed while
#     │                          ▲     exited by itself: a    │   │        its process is alive
#     │                          │     crash, an OOM kill, a  │   │
#     │                          │     failed health check    │   │
#     │                          └──── terminated (it had ────┘   │
#     │                                failed or frozen)          │
#     └──────────────────────────────── terminated after stop() ──┘
#
#   stop() of a STARTING or READY worker whose process is already gone: straight to STOPPED.
#   After CRASH_LIMIT failures in a row with no request served between, under a policy that `gives_up`, it
#   stays FAILED: only start(retry=True) (an admin load, a config reload) starts it again.
class WorkerState(StrEnum):
    """The state of a model's worker; `TRANSITIONS` lists the moves the diagram above allows."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"
    FAILED = "failed"

    @property
    def status(self) -> Status:
        """How the model is shown while its worker is in this state (and the scheduler does nothing to it)."""
        return _STATUS[self]

    def can_become(self, state: WorkerState) -> bool:
        """Whether the diagram has the move from this state to `state`."""
        return state in TRANSITIONS[self]


_STATUS = {
    WorkerState.STOPPED: Status.UNLOADED,
    WorkerState.STARTING: Status.LOADING,
    WorkerState.READY: Status.READY,
    WorkerState.STOPPING: Status.DRAINING,
    WorkerState.FAILED: Status.FAILED,
}

TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = MappingProxyType(
    {
        WorkerState.STOPPED: frozenset({WorkerState.STARTING}),
        WorkerState.STARTING: frozenset(
            {WorkerState.READY, WorkerState.FAILED, WorkerState.STOPPING, WorkerState.STOPPED}
        ),
        WorkerState.READY: frozenset({WorkerState.STOPPING, WorkerState.FAILED, WorkerState.STOPPED}),
        WorkerState.STOPPING: frozenset({WorkerState.FAILED, WorkerState.STOPPED}),
        WorkerState.FAILED: frozenset({WorkerState.STARTING, WorkerState.STOPPED}),
    }
)
"""Every move of a worker's state: `WorkerMachine` raises `IllegalTransition` on any other (a staying put is no
move). A cluster's `HostWorker` mirrors what its host reports, polled, so it may see two moves as one jump."""


class IllegalTransition(RuntimeError):
    """A move of a worker's state that `TRANSITIONS` does not have: a bug in the machine, never a user's error."""

    def __init__(self, old: WorkerState, new: WorkerState) -> None:
        super().__init__(f"a worker cannot go from {old.value} to {new.value}")
        self.old, self.new = old, new


class Worker(Protocol):
    """A model's worker as the gateway sees it; see the module docstring for the race semantics."""

    name: str
    state: WorkerState
    restarts: int
    last_error: str | None
    backoff: Backoff
    """The model's one `Backoff`: the wait before its next start after failures in a row. A worker that restarts
    itself (`Policy.restarts`) counts its failures in it; for the others `gateway.lifecycle.residency` counts the
    failed loads, and refuses requests with it meanwhile (Retry-After)."""

    @property
    def pid(self) -> int | None:
        """The local process group to measure memory from; None when there is none."""
        ...

    @property
    def wording(self) -> Wording:
        """How this model's 503s, broken calls and progress name its worker (`WorkerHandle.wording`)."""
        ...

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

    @property
    def headers(self) -> Mapping[str, str]:
        """What every call to this worker must carry: a cluster worker's launch secret
        (`gateway.cluster.host_worker.HostWorker`); `NO_HEADERS` for the others."""
        ...

    def connection_lost(self, cause: str) -> str:
        """What a client whose call to this worker broke is told (`cause`: the exception's name): a local
        worker is restarted by its supervisor, a remote endpoint is named, a cluster worker's host is named with
        what happens next."""
        ...

    def lost_signal(self) -> asyncio.Future[str] | None:
        """Resolves, with the reason, when the worker is declared gone while calls may be in flight to it and
        nothing closes their connections (a cluster host that froze or was cut off): the caller then ends them
        at once (`gateway.serving.upstream`). None where a gone worker's connections break by themselves (a
        local process is killed, a remote endpoint refuses)."""
        ...


@dataclass(frozen=True)
class WorkerExit:
    """How a running worker ended by itself: `cause` is short and bounded (`SIGSEGV`, `exit 1`, `unhealthy`,
    `frozen`: a metric label), `message` says it for a person. `grace_s`: how long its remains may take to stop
    (a frozen one gets none: resumed, it would end its requests in its own words, not the freeze's)."""

    cause: str
    message: str
    grace_s: float = 2.0


@dataclass(frozen=True)
class Wording:
    """How the 503s and the broken calls of a model speak of its worker (`WorkerHandle.wording`): the sentences
    are `WorkerMachine`'s, the words the handle's, so a remote endpoint is never said to be "loading".

    `loading`/`restarting`: a first/later start under way; `unavailable`: FAILED; `retried`: what happens next
    under a policy that restarts; `lost` and `lost_next`: a call that broke, "model 'm': {lost} (cause){lost_next}";
    `starting_phase`/`restarting_phase`: what a request waiting for a first/later start waits for (its progress);
    `loads`: whether a start loads the model here (False for a remote endpoint: its progress never says "loading")."""

    loading: str
    restarting: str
    unavailable: str
    retried: str
    lost: str
    lost_next: str
    starting_phase: str = "its worker is starting"
    restarting_phase: str = "its worker is restarting"
    loads: bool = True


LOCAL_WORDING = Wording(
    loading="is loading",
    restarting="is restarting",
    unavailable="is unavailable",
    retried="will be restarted",
    lost="worker connection lost",
    lost_next="; it is being restarted",
)
"""A worker process the gateway starts (`gateway.lifecycle.process.WorkerProcess`)."""


class WorkerHandle(Protocol):
    """The machinery of one model's worker, wherever it runs: launch it, wait until it is healthy, learn when
    it ends, terminate it. It keeps no lifecycle state of its own (no restarts, no backoff, no crash count):
    `gateway.lifecycle.supervisor.WorkerMachine` decides all of that. Transport-neutral: a local process
    (`gateway.lifecycle.process.WorkerProcess`) and a worker on another host implement it alike.

    One worker runs at a time per handle: `launch()` is called again only after `terminate()`. Every method
    runs on the event loop and never blocks it; `terminate()` is safe at any time and idempotent."""

    name: str

    @property
    def pid(self) -> int | None:
        """The local process group to measure memory from; None while nothing runs or on another host."""
        ...

    @property
    def wording(self) -> Wording:
        """How a model's 503s and broken calls name this worker (`LOCAL_WORDING` for a local process)."""
        ...

    async def launch(self) -> None:
        """Start one worker (a new process, a new port). Raise `WorkerStartError` when it cannot start at all."""
        ...

    async def wait_healthy(self) -> None:
        """Return once the worker answers its health check; raise `WorkerStartError` (with its cause and last
        log lines) when it exits, logs a fatal line or is not healthy within its startup timeout."""
        ...

    async def wait_exit(self) -> WorkerExit:
        """Return when the healthy worker ends (or stops answering) by itself."""
        ...

    async def terminate(self, grace_s: float) -> None:
        """End the worker and everything it spawned: ask, wait up to `grace_s`, then force."""
        ...

    def url(self) -> str | None:
        """The worker's root URL while one is launched; None otherwise."""
        ...

    def alive(self) -> bool:
        """True from `launch()` until the worker has ended (by itself or by `terminate()`)."""
        ...

    def log_lines(self) -> Sequence[str]:
        """The last lines the current worker logged (for error messages)."""
        ...


NO_HEADERS: Mapping[str, str] = MappingProxyType({})


def restarted_message(model: str, cause: str, wording: Wording = LOCAL_WORDING) -> str:
    """`Worker.connection_lost` of a supervised worker (a local one unless `wording` says otherwise)."""
    return f"model {model!r}: {wording.lost} ({cause}){wording.lost_next}"
