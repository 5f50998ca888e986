"""Admission: FIFO slots, a bounded queue, 429 beyond it, nothing leaked when a waiter is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import Admission
from gateway.errors import ErrorCode, GatewayError


async def test_requests_beyond_capacity_wait_in_order() -> None:
    admission = Admission("m", capacity=1, max_queue=4, queue_timeout_s=5)
    await admission.acquire()
    order: list[int] = []

    async def waiter(i: int) -> None:
        await admission.acquire()
        order.append(i)
        admission.release()

    tasks = [asyncio.create_task(waiter(i)) for i in range(3)]
    await asyncio.sleep(0.01)
    assert admission.waiting == 3
    admission.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    assert admission.running == 0


async def test_full_queue_is_429_with_retry_after() -> None:
    admission = Admission("m", capacity=1, max_queue=0, queue_timeout_s=5)
    await admission.acquire()
    with pytest.raises(GatewayError) as info:
        await admission.acquire()
    assert info.value.code is ErrorCode.QUEUE_FULL
    assert info.value.status == 429
    assert 1 <= int(info.value.headers()["retry-after"]) <= 60


async def test_queue_timeout_is_429() -> None:
    admission = Admission("m", capacity=1, max_queue=2, queue_timeout_s=0.05)
    await admission.acquire()
    with pytest.raises(GatewayError) as info:
        await admission.acquire()
    assert info.value.status == 429
    assert admission.waiting == 0


async def test_cancelled_waiter_leaks_no_slot() -> None:
    admission = Admission("m", capacity=1, max_queue=2, queue_timeout_s=5)
    await admission.acquire()
    task = asyncio.create_task(admission.acquire())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    admission.release()
    assert admission.running == 0
    assert admission.waiting == 0


async def test_a_request_with_n_choices_takes_n_slots_and_waits_its_turn_in_order() -> None:
    admission = Admission("m", capacity=4, max_queue=4, queue_timeout_s=5)
    assert admission.try_acquire(3)
    assert not admission.try_acquire(2)  # only one slot left
    big = asyncio.ensure_future(admission.acquire(2))
    await asyncio.sleep(0)
    small = asyncio.ensure_future(admission.acquire(1))  # may not overtake the head of the queue
    await asyncio.sleep(0)
    assert not big.done() and not small.done() and admission.running == 3
    admission.release(units=3)
    await asyncio.wait_for(asyncio.gather(big, small), 1)
    assert admission.running == 3
    admission.release(units=2)
    admission.release(units=1)
    assert admission.running == 0


async def test_more_choices_than_slots_run_alone() -> None:
    admission = Admission("m", capacity=2, max_queue=4, queue_timeout_s=5)
    assert admission.try_acquire(16)
    assert admission.running == 2 and not admission.try_acquire(1)
    admission.release(units=16)
    assert admission.running == 0
