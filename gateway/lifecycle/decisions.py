"""The scheduler's decisions as one pure function: `decide(models, event)` returns the effects to carry out.

`gateway.lifecycle.residency.Residency` is the executor: it turns what happens (a request, the reaper's tick, a
worker's state change, a load's turn under the lock, an unload that ended, an admin call) into an `Event`, takes
a snapshot of the models (`View`, one frozen value per model), asks `decide`, and carries out the effects in
order (starting a load, unloading, granting, failing waiters, remembering a failure). Nothing here awaits, locks,
reads a clock or touches a worker, so every interleaving of loads, drains, evictions and crashes is a list of
(snapshot, event) pairs a unit test states in a line (tests/unit/test_decisions.py). Which models to evict so
another fits is the evictor's decision (`gateway.lifecycle.eviction`), pure too, made under the lock when a
load's turn comes. The design is written once, in docs/lifecycle.md ("The scheduler: decisions and effects").

    event                    effects (in order)
    Requested(m)             Grant | AwaitWorker | Refuse(remembered failure) | Enqueue [+ StartLoad]
    LoadTurn(m)              Forget (every waiter gave up) | MakeRoomAndStart
    Tick                     Unload(m, "idle") for each model idle past its idle_unload_s
    WorkerChanged(m, state)  RememberFailure (an on-demand worker died while serving) | Publish
    Unloaded(m)              StartLoad when requests came while it drained
    DrainExpired(m)          ResumeServing (READY again, its waiters granted)
    AdminUnload(m)           Refuse (pinned) | Unload(m, "admin") when READY | nothing
    AdminLoad(m)             RetryWorker (a worker that starts itself) | ForgetFailure, then as Requested
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gateway.lifecycle.workers import Status, WorkerState

__all__ = [
    "AdminLoad", "AdminUnload", "AwaitWorker", "DrainExpired", "Effect", "Enqueue", "Event", "Forget",
    "ForgetFailure", "Grant", "LoadTurn", "MakeRoomAndStart", "Publish", "Refuse", "RememberFailure", "Requested",
    "ResumeServing", "RetryWorker", "StartLoad", "Tick", "Unload", "Unloaded", "View", "WorkerChanged", "decide",
]  # fmt: skip


@dataclass(frozen=True)
class View:
    """One model as the scheduler sees it at one instant (built by `Resident.view`)."""

    name: str
    status: Status  # as shown: the worker's, or the scheduler's step on it (`Resident.status`)
    serves: bool = False  # READY with no step on it, and its worker takes requests now
    restarts: bool = False  # its policy: the worker starts itself again after a failure
    evictable: bool = True
    holds: int = 0
    waiting: int = 0  # requests waiting for its load
    loading: bool = False  # a load under way (queued for its turn, making room, starting)
    reaping: bool = False  # an idle unload already on its way
    failure: str | None = None  # a remembered failed load
    backoff_left_s: float = 0.0  # of that failure
    idle_unload_s: float | None = None
    idle_s: float | None = None  # since its last request ended (None: never used)
    ready_s: float | None = None  # since it became READY (None: never)
    last_error: str | None = None  # its worker's


# -- events -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Requested:
    model: str


@dataclass(frozen=True)
class LoadTurn:
    model: str


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class WorkerChanged:
    model: str
    state: WorkerState


@dataclass(frozen=True)
class Unloaded:
    model: str


@dataclass(frozen=True)
class DrainExpired:
    model: str


@dataclass(frozen=True)
class AdminUnload:
    model: str


@dataclass(frozen=True)
class AdminLoad:
    model: str


Event = Requested | LoadTurn | Tick | WorkerChanged | Unloaded | DrainExpired | AdminUnload | AdminLoad


# -- effects ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grant:
    """A hold on the model for the request, now."""

    model: str


@dataclass(frozen=True)
class AwaitWorker:
    """Wait for a worker that starts itself (booting or restarting) to be READY."""

    model: str


@dataclass(frozen=True)
class Refuse:
    """The request (or admin call) gets an error now: the remembered failure's, or `reason`'s."""

    model: str
    reason: Literal["failed", "pinned"] = "failed"  # the remembered failure (with its Retry-After); never unloaded


@dataclass(frozen=True)
class Enqueue:
    """The request waits for the model's load."""

    model: str


@dataclass(frozen=True)
class StartLoad:
    """Start one load for every waiter; it takes its turn under the lock (`LoadTurn`)."""

    model: str


@dataclass(frozen=True)
class Forget:
    """Every waiter gave up while the load waited for its turn: no load, a remembered failure forgotten."""

    model: str


@dataclass(frozen=True)
class MakeRoomAndStart:
    """Evict what must go for the model to fit (the evictor decides), then start its worker."""

    model: str


@dataclass(frozen=True)
class Unload:
    """Drain the model's holds, then stop its worker."""

    model: str
    reason: str  # the eviction metric's label: "idle", "admin", "memory"
    why: str


@dataclass(frozen=True)
class RememberFailure:
    """An on-demand worker died while serving: FAILED with its backoff until a request loads it again."""

    model: str
    message: str
    served_s: float | None


@dataclass(frozen=True)
class Publish:
    """Show the model's state (metrics, views): nothing else changes."""

    model: str


@dataclass(frozen=True)
class ResumeServing:
    """A drain outlasted its bound: READY again, its waiters granted; the unload fails."""

    model: str


@dataclass(frozen=True)
class RetryWorker:
    """An admin load of a worker that starts itself: start it again even if it gave up after a crash loop."""

    model: str


@dataclass(frozen=True)
class ForgetFailure:
    """An admin load does not wait for a remembered failure's backoff (and retries a worker that gave up)."""

    model: str


Effect = (
    Grant | AwaitWorker | Refuse | Enqueue | StartLoad | Forget | MakeRoomAndStart | Unload | RememberFailure
    | Publish | ResumeServing | RetryWorker | ForgetFailure
)  # fmt: skip


def decide(models: Mapping[str, View], event: Event, *, closing: bool = False) -> tuple[Effect, ...]:
    """The effects of `event` on the models as they are now (`closing`: the gateway is shutting down)."""
    if isinstance(event, Tick):
        return tuple(_idle_unloads(models))
    view = models[event.model]
    match event:
        case Requested():
            return _requested(view, closing=closing)
        case LoadTurn():
            return (MakeRoomAndStart(view.name),) if view.waiting else (Forget(view.name),)
        case WorkerChanged(state=state):
            return _worker_changed(view, state)
        case DrainExpired():
            return (ResumeServing(view.name),)
        case Unloaded():
            return _kick(view, closing=closing)
        case AdminUnload():
            return _admin_unload(view)
        case AdminLoad():
            return _admin_load(view)
    raise AssertionError(f"no decision for {event!r}")  # pragma: no cover - every event is matched above


def _requested(view: View, *, closing: bool) -> tuple[Effect, ...]:
    if view.serves:
        return (Grant(view.name),)
    if view.restarts:
        return (AwaitWorker(view.name),)
    if view.status is Status.FAILED and view.failure is not None and view.backoff_left_s > 0:
        return (Refuse(view.name),)
    return (Enqueue(view.name), *_kick(view, waiting=view.waiting + 1, closing=closing))


def _kick(view: View, *, waiting: int | None = None, closing: bool) -> tuple[Effect, ...]:
    """One load for the model's waiters, when none is on its way and the model is not in memory (a model that
    drains loads again after its unload: `Unloaded`)."""
    waiting = view.waiting if waiting is None else waiting
    if closing or not waiting or view.loading or view.status not in (Status.UNLOADED, Status.FAILED):
        return ()
    return (StartLoad(view.name),)


def _idle_unloads(models: Mapping[str, View]) -> list[Effect]:
    return [
        Unload(v.name, "idle", f"no request for {v.idle_s:.1f} s (idle_unload_s {v.idle_unload_s:g})")
        for v in models.values()
        if v.idle_unload_s is not None and v.idle_s is not None and not v.reaping and _idle_for_long(v)
    ]


def _idle_for_long(view: View) -> bool:
    assert view.idle_unload_s is not None and view.idle_s is not None
    return view.status is Status.READY and not view.holds and view.idle_s >= view.idle_unload_s


def _worker_changed(view: View, state: WorkerState) -> tuple[Effect, ...]:
    """A worker only the scheduler starts that fails while it serves (no load of ours under way, no failure of
    ours remembered) is the scheduler's failure to remember; every other change is only shown."""
    served = not view.loading and view.failure is None
    if state is WorkerState.FAILED and served and not view.restarts:
        reason = view.last_error or "the worker exited"
        return (RememberFailure(view.name, f"model {view.name!r} stopped while serving: {reason}", view.ready_s),)
    return (Publish(view.name),)


def _admin_unload(view: View) -> tuple[Effect, ...]:
    if not view.evictable:
        return (Refuse(view.name, "pinned"),)
    if view.status is Status.READY:
        return (Unload(view.name, "admin", f"an admin asked to unload {view.name!r}"),)
    return ()


def _admin_load(view: View) -> tuple[Effect, ...]:
    if view.restarts:
        return (RetryWorker(view.name),)
    if view.status is Status.FAILED:
        return (ForgetFailure(view.name),)
    return ()
