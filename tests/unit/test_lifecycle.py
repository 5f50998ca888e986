"""The lifecycle's values and its worker state machine, in-process: `Policy` and `Backoff`, and `WorkerMachine`
driving a `WorkerHandle` that is not a process (as a worker on another host will be): restarts by policy,
the backoff between them, the crash-loop rule and the 503s a request gets meanwhile. No sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gateway.errors import GatewayError
from gateway.lifecycle import policy
from gateway.lifecycle.policy import PINNED, Backoff, Policy, policy_for
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import (
    LOCAL_WORDING,
    TRANSITIONS,
    IllegalTransition,
    WorkerExit,
    WorkerHandle,
    WorkerStartError,
    WorkerState,
)


class FakeHandle:
    """Stands for `gateway.lifecycle.process.WorkerProcess` (or a remote host's worker): each launch is
    healthy unless `fail_starts` says otherwise; `crash()` ends the running worker by itself."""

    wording = LOCAL_WORDING

    def __init__(self, fail_starts: int = 0) -> None:
        self.name = "m"
        self.pid: int | None = None
        self.fail_starts = fail_starts
        self.launches = 0
        self.terminations = 0
        self._exit: asyncio.Future[WorkerExit] | None = None

    async def launch(self) -> None:
        self.launches += 1
        self.pid = 1000 + self.launches
        self._exit = asyncio.get_running_loop().create_future()

    async def wait_healthy(self) -> None:
        if self.fail_starts:
            self.fail_starts -= 1
            raise WorkerStartError("exited with code 1 during start", "exit 1")

    async def wait_exit(self) -> WorkerExit:
        assert self._exit is not None
        return await self._exit

    def crash(self, cause: str = "SIGSEGV") -> None:
        assert self._exit is not None
        self._exit.set_result(WorkerExit(cause, f"worker exited ({cause})"))

    async def terminate(self, grace_s: float) -> None:
        del grace_s
        if self.pid is not None:
            self.terminations += 1
        self.pid, self._exit = None, None

    def url(self) -> str | None:
        return None if self.pid is None else f"http://worker-{self.pid}"

    def alive(self) -> bool:
        return self._exit is not None and not self._exit.done()

    def log_lines(self) -> Sequence[str]:
        return []


def as_handle(handle: FakeHandle) -> WorkerHandle:
    return handle  # mypy checks here that the fake keeps to the protocol


async def until(predicate: object, timeout_s: float = 5.0) -> None:
    async def wait() -> None:
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout_s)


@pytest.fixture(autouse=True)
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "BACKOFF_INITIAL_S", 0.05)


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_healthy_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy, "BACKOFF_INITIAL_S", 1.0)
    backoff = Backoff(healthy_reset_s=30.0)
    assert [backoff.fail() for _ in range(8)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert backoff.waiting()
    backoff.served_for(29.0)  # not long enough: still a loop
    assert backoff.fail() == 60
    backoff.served_for(30.0)
    assert backoff.failures == 0 and not backoff.waiting()
    assert backoff.fail() == 1


def test_pinned_and_on_demand_differ_only_in_their_policy() -> None:
    assert policy_for("always") is PINNED
    assert (PINNED.at_boot, PINNED.evictable, PINNED.restarts) == (True, False, True)
    on_demand = policy_for("on_demand", idle_unload_s=90.0)
    assert (on_demand.at_boot, on_demand.evictable, on_demand.restarts) == (False, True, False)
    assert on_demand.idle_unload_s == 90.0 and not on_demand.pinned


async def test_a_pinned_worker_restarts_by_itself_after_a_crash() -> None:
    handle = FakeHandle()
    states: list[WorkerState] = []
    worker = WorkerMachine(as_handle(handle), PINNED, on_state=lambda _, s: states.append(s))
    await worker.ensure_ready(5)
    assert worker.base_url() == "http://worker-1001"
    handle.crash()
    await until(lambda: handle.launches == 2 and worker.state is WorkerState.READY)
    assert worker.restarts == 1 and worker.base_url() == "http://worker-1002"
    assert states == [WorkerState.STARTING, WorkerState.READY, WorkerState.FAILED, WorkerState.STARTING,
                      WorkerState.READY]  # fmt: skip
    await worker.stop()
    assert worker.state is WorkerState.STOPPED and handle.terminations == 2


async def test_an_on_demand_worker_stays_failed_until_the_next_start() -> None:
    handle = FakeHandle()
    worker = WorkerMachine(as_handle(handle), policy_for("on_demand"))
    await worker.ensure_ready(5)
    handle.crash("exit 3")
    await until(lambda: worker.state is WorkerState.FAILED)
    await asyncio.sleep(0.2)  # past the backoff a pinned worker would have used
    assert handle.launches == 1
    with pytest.raises(GatewayError) as info:
        worker.base_url()
    assert info.value.status == 503 and "will be restarted" not in info.value.message
    await worker.ensure_ready(5)  # the next request's load
    assert handle.launches == 2 and worker.state is WorkerState.READY
    await worker.stop()


async def test_three_failed_starts_in_a_row_give_up_until_a_retry() -> None:
    crashes: list[str] = []
    handle = FakeHandle(fail_starts=3)
    worker = WorkerMachine(as_handle(handle), PINNED, on_crash=lambda _, cause: crashes.append(cause))
    worker.start()
    await until(lambda: worker.gave_up is not None)
    assert crashes == ["exit 1"] * 3 and handle.launches == 3
    await asyncio.sleep(0.3)
    assert handle.launches == 3  # no fourth start behind anyone's back
    with pytest.raises(WorkerStartError, match="3 times in a row"):
        await worker.await_ready(1)
    worker.start()  # a request does not restart a worker that gave up
    assert handle.launches == 3
    await worker.ensure_ready(5, retry=True)  # an admin load or a config reload does
    assert worker.gave_up is None and handle.launches == 4
    await worker.stop()


async def test_a_request_served_between_crashes_ends_the_streak() -> None:
    handle = FakeHandle()
    worker = WorkerMachine(as_handle(handle), PINNED, crash_limit=2)
    await worker.ensure_ready(5)
    for launch in (2, 3, 4):
        handle.crash()
        await until(lambda n=launch: handle.launches == n and worker.state is WorkerState.READY)  # type: ignore[misc]
        worker.note_success()
    assert worker.gave_up is None
    await worker.stop()


# -- the transitions table -------------------------------------------------------------------------------
class Moves:
    """Every move a machine makes, as (from, to), read from its `on_state` reports."""

    def __init__(self) -> None:
        self.seen: set[tuple[WorkerState, WorkerState]] = set()
        self.last: dict[int, WorkerState] = {}

    def machine(self, handle: FakeHandle, worker_policy: Policy = PINNED) -> WorkerMachine:
        worker = WorkerMachine(as_handle(handle), worker_policy)
        self.last[id(worker)] = worker.state
        worker._on_state = lambda _, state: self._moved(worker, state)
        return worker

    def _moved(self, worker: WorkerMachine, state: WorkerState) -> None:
        self.seen.add((self.last[id(worker)], state))
        self.last[id(worker)] = state


class LiveHandle(FakeHandle):
    """A worker process is not ended by the machine ceasing to wait for its exit: `stop()` finds it alive."""

    async def wait_exit(self) -> WorkerExit:
        assert self._exit is not None
        return await asyncio.shield(self._exit)


class DyingStartHandle(FakeHandle):
    """A start that fails because the process exited (nothing left to terminate)."""

    async def wait_healthy(self) -> None:
        assert self._exit is not None
        self._exit.set_result(WorkerExit("exit 1", "exited"))
        raise WorkerStartError("exited with code 1 during start", "exit 1")


class SlowHandle(FakeHandle):
    """A launch (`slow_launch`, no process yet) or a health check (`slow_health`) that waits until stopped."""

    def __init__(self, *, slow_launch: bool = False, slow_health: bool = False) -> None:
        super().__init__()
        self.slow_launch, self.slow_health = slow_launch, slow_health

    async def launch(self) -> None:
        if self.slow_launch:
            await asyncio.Event().wait()
        await super().launch()

    async def wait_healthy(self) -> None:
        if self.slow_health:
            await asyncio.Event().wait()


async def test_the_machine_makes_every_move_of_the_transitions_table_and_no_other() -> None:
    moves = Moves()
    worker = moves.machine(crashing := LiveHandle())  # STOPPED -> STARTING -> READY -> FAILED -> STARTING
    await worker.ensure_ready(5)
    crashing.crash()
    await until(lambda: crashing.launches == 2 and worker.state is WorkerState.READY)
    await worker.stop()  # READY -> STOPPING -> STOPPED
    worker = moves.machine(FakeHandle(fail_starts=1), policy_for("on_demand"))
    with pytest.raises(WorkerStartError):  # STARTING -> STOPPING -> FAILED: its process was still alive
        await worker.ensure_ready(5)
    await worker.stop()  # FAILED -> STOPPED
    worker = moves.machine(DyingStartHandle(), policy_for("on_demand"))
    with pytest.raises(WorkerStartError):  # STARTING -> FAILED: nothing left to terminate
        await worker.ensure_ready(5)
    for handle in (SlowHandle(slow_launch=True), SlowHandle(slow_health=True)):
        worker = moves.machine(handle)
        worker.start()
        await until(lambda w=worker: w.state is WorkerState.STARTING)  # type: ignore[misc]
        await asyncio.sleep(0.01)
        await worker.stop()  # STARTING -> STOPPED (no process yet), STARTING -> STOPPING (one starting)
    worker = moves.machine(dead := FakeHandle())
    await worker.ensure_ready(5)
    dead.crash()
    await worker.stop()  # READY -> STOPPED: it had died, the machine not yet told
    table = {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
    assert moves.seen == table


def test_a_move_the_table_lacks_raises_and_changes_nothing() -> None:
    worker = WorkerMachine(as_handle(FakeHandle()), PINNED)
    for old, new in [(WorkerState.STOPPED, WorkerState.READY), (WorkerState.FAILED, WorkerState.READY),
                     (WorkerState.STOPPED, WorkerState.FAILED), (WorkerState.STOPPING, WorkerState.READY)]:  # fmt: skip
        worker.state = old
        assert not old.can_become(new)
        with pytest.raises(IllegalTransition, match=f"from {old.value} to {new.value}"):
            worker._set_state(new)
        assert worker.state is old
    worker._set_state(WorkerState.STOPPED)  # staying put is no move
    assert worker.state is WorkerState.STOPPED


def test_each_worker_state_shows_as_the_model_status_of_the_diagram() -> None:
    shown = {state.value: state.status.value for state in WorkerState}
    assert shown == {"stopped": "unloaded", "starting": "loading", "ready": "ready", "stopping": "draining",
                     "failed": "failed"}  # fmt: skip


class SlowEndHandle(LiveHandle):
    """A process that takes a while to end after SIGTERM, and counts how many are alive at once."""

    def __init__(self) -> None:
        super().__init__()
        self.alive_at_once = 0

    async def launch(self) -> None:
        await super().launch()
        self.alive_at_once = max(self.alive_at_once, 1 + int(self.terminations < self.launches - 1))

    async def terminate(self, grace_s: float) -> None:
        await asyncio.sleep(0.2)
        await super().terminate(grace_s)


async def test_a_start_during_a_stop_waits_for_the_old_process_to_end_then_starts_one() -> None:
    """A request's load that lands while an eviction is still ending the process (STOPPING): the new start
    waits for STOPPED, then launches; never two processes at once, never an illegal move."""
    handle = SlowEndHandle()
    worker = WorkerMachine(as_handle(handle), policy_for("on_demand"))
    await worker.ensure_ready(5)
    stopping = asyncio.create_task(worker.stop())
    await until(lambda: worker.state is WorkerState.STOPPING)
    await worker.ensure_ready(5)  # a hang guard, not a speed limit
    await stopping
    assert worker.state is WorkerState.READY
    assert handle.launches == 2 and handle.terminations == 1 and handle.alive_at_once == 1
    await worker.stop()
