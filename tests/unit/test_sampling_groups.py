"""The scheduler's waiting queue: groups leave from the front as far as slots allow, in arrival order."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.tickets import GenerationRequest, Ticket
from backends.llamacpp.worker.waiting import WaitingQueue


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    running = asyncio.new_event_loop()
    yield running
    running.close()


def tickets(loop: asyncio.AbstractEventLoop, *names: str) -> list[Ticket]:
    return [Ticket(GenerationRequest(name, (1,), SamplingParams()), loop, lambda: None) for name in names]


def ids(taken: list[tuple[int, Ticket]]) -> list[tuple[int, str]]:
    return [(key, ticket.request.request_id) for key, ticket in taken]


def test_a_group_gives_what_fits_and_keeps_the_rest_at_the_front(loop: asyncio.AbstractEventLoop) -> None:
    queue = WaitingQueue()
    queue.push(tickets(loop, "a1", "a2", "a3"))
    queue.push(tickets(loop, "b"))
    assert len(queue) == 4
    assert ids(queue.take(2)) == [(1, "a1"), (1, "a2")]
    assert ids(queue.take(2)) == [(1, "a3"), (2, "b")]
    assert len(queue) == 0
    assert not queue


def test_cancelled_tickets_leave_and_empty_groups_with_them(loop: asyncio.AbstractEventLoop) -> None:
    queue = WaitingQueue()
    first, second = tickets(loop, "a1", "a2"), tickets(loop, "b1")
    queue.push(first)
    queue.push(second)
    first[0].cancel()
    second[0].cancel()
    assert [t.request.request_id for t in queue.drop_cancelled()] == ["a1", "b1"]
    assert len(queue) == 1
    assert ids(queue.take(5)) == [(1, "a2")]


def test_drain_empties_the_queue(loop: asyncio.AbstractEventLoop) -> None:
    queue = WaitingQueue()
    queue.push(tickets(loop, "a", "b"))
    assert [t.request.request_id for t in queue.drain()] == ["a", "b"]
    assert len(queue) == 0
