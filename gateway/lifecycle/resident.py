"""One model as the residency manager keeps it (`Resident`): the holds requests keep on it, the requests
waiting for its load, what the scheduler is doing to it (a load, a drain), a remembered failed load, its memory
and load history; and the admin view of it.

It keeps no state of its own: the model's state is its worker's (`gateway.lifecycle.workers.WorkerState`, drawn
there), shown as the scheduler's step on it while it takes one (`Resident.status`). Only
`gateway.lifecycle.residency` (the scheduler, under its lock or on the event loop) calls what changes a
`Resident`; the rest reads.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ErrorCode, GatewayError
from gateway.lifecycle.decisions import View
from gateway.lifecycle.deployments import Deployment
from gateway.lifecycle.memory import ModelMemory
from gateway.lifecycle.policy import Backoff, Policy
from gateway.lifecycle.workers import Status, WorkerState

_SCHEDULED = {WorkerState.STOPPING: Status.FAILED, WorkerState.FAILED: Status.UNLOADED}
"""How a worker that only the scheduler starts (its policy does not `restarts`) shows in these states when the
scheduler takes no step on it: STOPPING, it left READY by itself a moment ago (FAILED at once; its error is
remembered as its process is reaped); FAILED with no error remembered, its failure was forgotten (no waiter was
left for the load after it, or a model to evict stayed busy), so the next request loads it: UNLOADED."""


@dataclass(frozen=True)
class Progress:
    """Where a load stands: `phase` changes with each step (making room, starting the worker)."""

    model: str
    phase: str
    elapsed_s: float
    loading: bool = True  # False while a remote endpoint is awaited: nothing loads here

    @property
    def text(self) -> str:
        subject = f"loading model {self.model!r}" if self.loading else f"model {self.model!r}"
        return f"{subject}: {self.phase} ({self.elapsed_s:.0f} s)"


class Hold:
    """A request's claim on a loaded model: while any is held the model is not unloaded. `release()` is
    idempotent; the request's `RequestScope.finish()` calls it on every path."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._release()


@dataclass(eq=False)
class Resident:
    """A deployment's residency bookkeeping. `holds` counts requests holding it (admitted, queued for a
    slot or at the worker); `pending` are requests waiting for its load, each granted a `Hold` (or the
    load's error) in the step the load ends; `idle` is set while nothing holds it. `load_task` is the load
    under way, `draining` an unload waiting for its holds to end (no new ones meanwhile), `error` the failed
    load remembered (with `backoff`) until the next load: the scheduler's steps, over its worker's state."""

    deployment: Deployment
    memory: ModelMemory
    holds: int = 0
    pending: set[asyncio.Future[Hold]] = field(default_factory=set)
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    last_used: float | None = None
    last_used_wall: float | None = None
    load_task: asyncio.Task[None] | None = None
    reaping: bool = False
    draining: bool = False
    progress: str | None = None
    phase_started: float = 0.0
    loads: int = 0
    last_load_s: float | None = None
    ready_at: float | None = None
    error: str | None = None
    retry_crashed: bool = False  # an admin load: also retry a worker that gave up after a crash loop

    def __post_init__(self) -> None:
        self.idle.set()

    @property
    def name(self) -> str:
        return self.deployment.name

    @property
    def policy(self) -> Policy:
        return self.deployment.policy

    @property
    def backoff(self) -> Backoff:
        """Its worker's (`gateway.lifecycle.workers.Worker.backoff`): a failed load is remembered in it."""
        return self.deployment.worker.backoff

    @property
    def evictable(self) -> bool:
        return self.policy.evictable

    def touch(self) -> None:
        self.last_used, self.last_used_wall = time.monotonic(), time.time()

    # -- what the scheduler decides from (`gateway.lifecycle.decide`) -------------------------------------
    def view(self, now: float) -> View:
        """This model as the scheduler's decisions see it at `now` (monotonic)."""
        status = self.status()
        return View(
            name=self.name,
            status=status,
            serves=status is Status.READY and self._takes_requests(),
            restarts=self.policy.restarts,
            evictable=self.policy.evictable,
            holds=self.holds,
            waiting=len(self.pending),
            loading=self.load_task is not None,
            reaping=self.reaping,
            failure=self.error,
            backoff_left_s=self.backoff.left_s() if self.backoff.waiting() else 0.0,
            idle_unload_s=self.policy.idle_unload_s,
            idle_s=None if self.last_used is None else now - self.last_used,
            ready_s=None if self.ready_at is None else now - self.ready_at,
            last_error=self.deployment.worker.last_error,
        )

    def _takes_requests(self) -> bool:
        """Its worker's state machine says it serves now."""
        try:
            self.deployment.worker.base_url()
        except GatewayError:
            return False
        return True

    # -- holds and waiters (changed only by `gateway.lifecycle.residency`) --------------------------------
    def grant(self) -> Hold:
        """A new hold: the model is not unloaded until it is released."""
        self.holds += 1
        self.idle.clear()
        self.touch()

        def release() -> None:
            self.holds -= 1
            self.touch()
            if self.holds == 0:
                self.idle.set()

        return Hold(release)

    def grant_pending(self) -> None:
        """Every waiter gets its hold, in the step the model became READY."""
        for waiter in self.pending:
            if not waiter.done():
                waiter.set_result(self.grant())
        self.pending.clear()

    def fail_pending(self, error: Callable[[], GatewayError]) -> None:
        """Every waiter gets `error()`."""
        for waiter in self.pending:
            if not waiter.done():
                waiter.set_exception(error())
        self.pending.clear()

    # -- the errors a request gets ------------------------------------------------------------------------
    def failed_error(self) -> GatewayError:
        """The remembered failed load, with what is left of its backoff as Retry-After."""
        left = max(1.0, self.backoff.left_s())
        return GatewayError(ErrorCode.WORKER_UNAVAILABLE, self.error or "failed to load", retry_after_s=left)

    def still_loading(self, waited_s: float) -> GatewayError:
        expected = self.last_load_s or 10.0
        return GatewayError(
            ErrorCode.WORKER_UNAVAILABLE,
            f"model {self.name!r} is still loading after {waited_s:.0f} s ({self.progress_now().phase}); retry shortly",
            retry_after_s=max(2.0, expected - (time.monotonic() - self.phase_started)),
        )

    # -- views ----------------------------------------------------------------------------------------------
    def status(self) -> Status:
        """The model's state as shown (/v1/models, /ready, /admin/models); never a precondition outside the
        scheduler. Its worker's, unless the scheduler is loading or draining it or remembers its failed load
        (and, for a worker only the scheduler starts, `_SCHEDULED`)."""
        if self.load_task is not None:
            return Status.LOADING
        if self.error is not None:
            return Status.FAILED
        if self.draining:
            return Status.DRAINING
        worker = self.deployment.worker.state
        if self.policy.restarts:
            return worker.status
        return _SCHEDULED.get(worker, worker.status)

    def progress_now(self) -> Progress:
        """What a request waiting for the model waits for: the scheduler's step, else which start of its worker."""
        if self.progress is None:
            worker = self.deployment.worker
            words = worker.wording
            phase = words.starting_phase if worker.restarts == 0 else words.restarting_phase
            return Progress(self.name, phase, time.monotonic() - self.phase_started, loading=words.loads)
        return Progress(self.name, self.progress, time.monotonic() - self.phase_started)

    def failure(self) -> str | None:
        """Why a FAILED model is failed (for display); None in every other state."""
        if self.status() is not Status.FAILED:
            return None
        return self.error or self.deployment.worker.last_error or "the worker failed"

    def describe(self) -> dict[str, Any]:
        """The admin view: state, requests, last use, memory per pool (estimated and measured), loads."""
        now, shown = time.monotonic(), self.status()
        # a failed load's backoff, until a load ends well or an unload (a worker that restarts itself: none here)
        remembered = self.backoff.retry_at is not None and not self.policy.restarts
        pools = sorted({*self.memory.estimated, *self.memory.measured})
        memory = {p: {"estimated_bytes": self.memory.estimated.get(p), "measured_bytes": self.memory.measured.get(p)}
                  for p in pools}  # fmt: skip
        idle = round(now - self.last_used, 1) if self.last_used is not None and not self.holds else None
        return {
            "model": self.name,
            "load": self.deployment.load,
            "state": shown.value,
            "worker": self.deployment.worker.state.value,
            "idle_unload_s": self.deployment.idle_unload_s,
            "in_flight": self.holds,
            "waiting": len(self.pending),
            "last_used": _iso(self.last_used_wall),
            "idle_s": idle,
            "memory": memory,
            "loads": self.loads,
            "last_load_s": round(self.last_load_s, 2) if self.last_load_s is not None else None,
            "progress": self.progress_now().text if self.load_task is not None else None,
            "error": self.error if shown is Status.FAILED else None,
            "retry_in_s": round(self.backoff.left_s(), 1) if remembered else None,
        }


def _iso(wall: float | None) -> str | None:
    return None if wall is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))
