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

    Concurrency contract: every successful `acquire()` must be paired with exactly one `release()`;
    a cancelled `acquire()` holds nothing (its place in the queue is dropped, or a slot granted in the
    same instant is passed on).
    """

    def __init__(self, model: str, capacity: int, max_queue: int, queue_timeout_s: float) -> None:
        self.model = model
        self.capacity = capacity
        self.max_queue = max_queue
        self.queue_timeout_s = queue_timeout_s
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._recent_service_s = 5.0

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def _retry_after(self) -> float:
        per_slot = max(1.0, self._recent_service_s)
        return min(60.0, per_slot * (1 + self.waiting / max(1, self.capacity)))

    def try_acquire(self) -> bool:
        """Take a free slot if one is free and nobody queues before us; never waits. True: hold it."""
        if self.running < self.capacity and not self._waiters:
            self.running += 1
            return True
        return False

    async def acquire(self) -> float:
        """Wait for a slot; return the seconds spent waiting."""
        if self.try_acquire():
            return 0.0
        if len(self._waiters) >= self.max_queue:
            raise GatewayError(
                ErrorCode.QUEUE_FULL,
                f"model {self.model!r} is at capacity ({self.running} running, {self.waiting} queued); retry later",
                retry_after_s=self._retry_after(),
            )
        started = time.monotonic()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout_s)
        except TimeoutError:
            if waiter.done():  # granted in the same instant: keep it
                return time.monotonic() - started
            self._waiters.remove(waiter)
            raise GatewayError(
                ErrorCode.QUEUE_FULL,
                f"model {self.model!r} is busy: no slot freed within {self.queue_timeout_s:.0f} s; retry later",
                retry_after_s=self._retry_after(),
            ) from None
        except asyncio.CancelledError:
            if waiter.done():
                self.release()
            else:
                self._waiters.remove(waiter)
            raise
        return time.monotonic() - started

    def release(self, service_s: float | None = None) -> None:
        if service_s is not None:
            self._recent_service_s = 0.8 * self._recent_service_s + 0.2 * service_s
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes directly to the next in line
                return
        self.running -= 1
