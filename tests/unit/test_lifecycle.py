"""The lifecycle's values and its worker state machine, in-process: `Policy` and `Backoff`, and `WorkerMachine`
driving a `WorkerHandle` that is not a process (as a worker on another host will be): restarts by policy,
the backoff between them, the crash-loop rule and the 503s a request gets meanwhile. No sockets."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from gateway.errors import GatewayError
from gateway.lifecycle import policy
from gateway.lifecycle.policy import PINNED, Backoff, policy_for
from gateway.lifecycle.supervisor import WorkerMachine
from gateway.lifecycle.workers import LOCAL_WORDING, WorkerExit, WorkerHandle, WorkerStartError, WorkerState


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
