"""The scheduler's decisions (`gateway.lifecycle.decisions.decide`), pure: each interleaving of requests, loads,
drains, evictions, crashes and admin calls is a snapshot of the models and an event, no asyncio, no worker.
`tests/unit/test_residency*.py` drive the executor (`Residency`) through the same cases with real tasks."""

from __future__ import annotations

import typing
from dataclasses import replace

import pytest

from gateway.lifecycle.decisions import (
    AdminLoad,
    AdminUnload,
    AwaitWorker,
    DrainExpired,
    Enqueue,
    Event,
    Forget,
    ForgetFailure,
    Grant,
    LoadTurn,
    MakeRoomAndStart,
    Publish,
    Refuse,
    RememberFailure,
    Requested,
    ResumeServing,
    RetryWorker,
    StartLoad,
    Tick,
    Unload,
    Unloaded,
    View,
    WorkerChanged,
    decide,
)
from gateway.lifecycle.workers import Status, WorkerState

UNLOADED = View("m", Status.UNLOADED, idle_unload_s=60.0)
READY = View("m", Status.READY, serves=True, idle_unload_s=60.0, idle_s=1.0, ready_s=5.0)
PINNED_STARTING = View("p", Status.LOADING, restarts=True, evictable=False)


def one(view: View, event: Event, *, closing: bool = False) -> tuple[object, ...]:
    return decide({view.name: view}, event, closing=closing)


# -- requests ---------------------------------------------------------------------------------------------------
def test_a_request_for_a_model_that_serves_is_granted_a_hold() -> None:
    assert one(READY, Requested("m")) == (Grant("m"),)


def test_a_request_for_a_model_whose_worker_starts_itself_waits_for_that_worker() -> None:
    assert one(PINNED_STARTING, Requested("p")) == (AwaitWorker("p"),)


def test_the_first_request_for_an_unloaded_model_starts_one_load_the_second_only_waits_for_it() -> None:
    assert one(UNLOADED, Requested("m")) == (Enqueue("m"), StartLoad("m"))
    loading = replace(UNLOADED, status=Status.LOADING, loading=True, waiting=1)
    assert one(loading, Requested("m")) == (Enqueue("m"),)


def test_a_request_while_the_model_drains_waits_and_the_end_of_the_unload_starts_its_load() -> None:
    draining = replace(READY, status=Status.DRAINING, serves=False, holds=1)
    assert one(draining, Requested("m")) == (Enqueue("m"),)
    assert one(replace(UNLOADED, waiting=1), Unloaded("m")) == (StartLoad("m"),)
    assert one(UNLOADED, Unloaded("m")) == ()


def test_a_remembered_failure_refuses_requests_until_its_backoff_ends_then_the_next_one_loads() -> None:
    failed = replace(UNLOADED, status=Status.FAILED, failure="model 'm' failed to load: boom", backoff_left_s=3.0)
    assert one(failed, Requested("m")) == (Refuse("m"),)
    assert one(replace(failed, backoff_left_s=0.0), Requested("m")) == (Enqueue("m"), StartLoad("m"))


def test_no_load_starts_while_the_gateway_shuts_down() -> None:
    assert one(UNLOADED, Requested("m"), closing=True) == (Enqueue("m"),)
    assert one(replace(UNLOADED, waiting=1), Unloaded("m"), closing=True) == ()


# -- a load's turn ----------------------------------------------------------------------------------------------
def test_a_load_whose_waiters_all_gave_up_before_its_turn_is_forgotten() -> None:
    queued = replace(UNLOADED, status=Status.LOADING, loading=True)
    assert one(queued, LoadTurn("m")) == (Forget("m"),)
    assert one(replace(queued, waiting=2), LoadTurn("m")) == (MakeRoomAndStart("m"),)


# -- the reaper -------------------------------------------------------------------------------------------------
def test_the_tick_unloads_each_ready_model_idle_past_its_idle_unload_s_and_says_why() -> None:
    idle = replace(READY, idle_s=61.5)
    other = replace(READY, name="n", idle_s=2.0)
    assert decide({"m": idle, "n": other}, Tick()) == (Unload("m", "idle", "no request for 61.5 s (idle_unload_s 60)"),)


@pytest.mark.parametrize(
    "why, view",
    [
        ("a request holds it", replace(READY, idle_s=99.0, holds=1)),
        ("its idle unload is on its way", replace(READY, idle_s=99.0, reaping=True)),
        ("it is pinned", replace(READY, idle_s=99.0, idle_unload_s=None, evictable=False)),
        ("it is draining", replace(READY, idle_s=99.0, status=Status.DRAINING)),
        ("it was never used", replace(READY, idle_s=None)),
    ],
)
def test_the_tick_leaves_a_model_alone_when(why: str, view: View) -> None:
    assert decide({"m": view}, Tick()) == (), why


# -- the worker's own changes -----------------------------------------------------------------------------------
def test_an_on_demand_worker_that_dies_while_serving_is_remembered_as_failed_with_its_cause() -> None:
    crashed = replace(READY, last_error="signal SIGSEGV", ready_s=42.0)
    assert one(crashed, WorkerChanged("m", WorkerState.FAILED)) == (
        RememberFailure("m", "model 'm' stopped while serving: signal SIGSEGV", 42.0),
    )


def test_a_worker_dying_while_it_drains_is_a_failure_to_remember_too() -> None:
    draining = replace(READY, status=Status.DRAINING, serves=False)
    assert isinstance(one(draining, WorkerChanged("m", WorkerState.FAILED))[0], RememberFailure)


@pytest.mark.parametrize(
    "why, view, state",
    [
        ("the load under way reports it", replace(UNLOADED, status=Status.LOADING, loading=True), WorkerState.FAILED),
        ("a failure is already remembered", replace(UNLOADED, failure="x"), WorkerState.FAILED),
        ("its worker restarts itself", replace(PINNED_STARTING, name="m"), WorkerState.FAILED),
        ("it did not fail", READY, WorkerState.STOPPING),
    ],
)
def test_a_worker_change_is_only_shown_when(why: str, view: View, state: WorkerState) -> None:
    assert one(view, WorkerChanged("m", state)) == (Publish("m"),), why


def test_a_crash_then_requests_the_failure_is_returned_until_the_backoff_ends() -> None:
    """The interleaving step by step: serving, a crash, a request in the backoff, one after it."""
    (remember,) = one(READY, WorkerChanged("m", WorkerState.FAILED))
    assert isinstance(remember, RememberFailure)
    failed = replace(READY, status=Status.FAILED, serves=False, failure=remember.message, backoff_left_s=1.0)
    assert one(failed, Requested("m")) == (Refuse("m"),)
    assert one(replace(failed, backoff_left_s=0.0), Requested("m")) == (Enqueue("m"), StartLoad("m"))


# -- drains and admin calls -------------------------------------------------------------------------------------
def test_a_drain_past_its_bound_resumes_serving() -> None:
    assert one(replace(READY, status=Status.DRAINING, holds=1), DrainExpired("m")) == (ResumeServing("m"),)


def test_an_admin_unload_of_a_pinned_model_is_refused_of_a_ready_one_drains_it_of_another_does_nothing() -> None:
    assert one(replace(READY, evictable=False), AdminUnload("m")) == (Refuse("m", "pinned"),)
    assert one(READY, AdminUnload("m")) == (Unload("m", "admin", "an admin asked to unload 'm'"),)
    assert one(UNLOADED, AdminUnload("m")) == ()


def test_an_admin_load_retries_a_worker_that_starts_itself_and_forgets_a_remembered_failure() -> None:
    assert one(PINNED_STARTING, AdminLoad("p")) == (RetryWorker("p"),)
    assert one(replace(UNLOADED, status=Status.FAILED, failure="x"), AdminLoad("m")) == (ForgetFailure("m"),)
    assert one(UNLOADED, AdminLoad("m")) == ()


def test_every_event_kind_has_a_decision_for_every_state() -> None:
    samples: dict[type, Event] = {Tick: Tick(), WorkerChanged: WorkerChanged("m", WorkerState.FAILED)}
    for event_type in typing.get_args(Event):
        event = samples.get(event_type) or event_type("m")
        for status in Status:
            assert isinstance(decide({"m": replace(UNLOADED, status=status)}, event), tuple)
