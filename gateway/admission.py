"""Per-deployment admission: at most `capacity` requests at the worker, a bounded FIFO queue behind them.

A request that finds the queue full, or waits longer than the queue timeout, gets a 429 with Retry-After;
nobody already admitted or queued is disturbed by it.
"""

from __future__ import annotations

import asyncio
import collections
import time

from gateway.errors import ErrorCode, GatewayError


class Admission:
    """FIFO admission. `acquire()` either returns holding a slot or raises `GatewayError` (429).

    Concurrency contract: every successful `acquire(units)` must be paired with exactly one
    `release(units=units)`; a cancelled `acquire()` holds nothing (its place in the queue is dropped, or
    slots granted in the same instant are passed on). `units` is the request's number of choices (`n`).
    """

    def __init__(self, model: str, capacity: int, max_queue: int, queue_timeout_s: float) -> None:
        self.model = model
        self.capacity = capacity
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.running = 0
        self._waiters: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()
        self._recent_service_s = 5.0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def full(self) -> bool:
        """Every slot taken and the queue at its limit: the next request would get a 429."""
        return self.running >= self.capacity and len(self._waiters) >= self.max_queue

    def _retry_after(self) -> float:
        per_slot = max(1.0, self._recent_service_s)
        return min(60.0, per_slot * (1 + self.waiting / max(1, self.capacity)))

    def _units(self, units: int) -> int:
        """A request with more choices than the deployment has slots runs alone: it takes all of them."""
        return max(1, min(units, self.capacity))

    def try_acquire(self, units: int = 1) -> bool:
        """Take `units` free slots (one per choice of an `n` > 1 request) if they are free and nobody queues
        before us; never waits. True: hold them."""
        units = self._units(units)
        if self.running + units <= self.capacity and not self._waiters:
            self.running += units
            return True
        return False

    async def acquire(self, units: int = 1) -> float:
        """Wait for `units` slots; return the seconds spent waiting."""
        units = self._units(units)
        if self.try_acquire(units):
            return 0.0
        if len(self._waiters) >= self.max_queue:
            raise GatewayError(
                ErrorCode.QUEUE_FULL,
                f"model {self.model!r} is at capacity ({self.running} running, {self.waiting} queued); retry later",
                retry_after_s=self._retry_after(),
            )
        started = time.monotonic()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (waiter, units)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except TimeoutError:
            if waiter.done():  # granted in the same instant: keep it
                return time.monotonic() - started
            self._waiters.remove(entry)
            self._grant()  # a large request leaving the head may let smaller ones behind it in
            raise GatewayError(
                ErrorCode.QUEUE_FULL,
                f"model {self.model!r} is busy: no slot freed within {self.queue_timeout_s:.0f} s; retry later",
                retry_after_s=self._retry_after(),
            ) from None
        except asyncio.CancelledError:
            if waiter.done():
                self.release(units=units)
            else:
                self._waiters.remove(entry)
                self._grant()
            raise
        return time.monotonic() - started

    def release(self, service_s: float | None = None, *, units: int = 1) -> None:
        if service_s is not None:
            self._recent_service_s = 0.8 * self._recent_service_s + 0.2 * service_s
        self.running -= self._units(units)
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to the queue in order: the head waits until its units are free (FIFO, no overtaking)."""
        while self._waiters:
            waiter, units = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if self.running + units > self.capacity:
                return
            self._waiters.popleft()
            self.running += units
            waiter.set_result(None)
