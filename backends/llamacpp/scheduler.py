"""Continuous batching over one llama.cpp context: slots, a bounded FIFO queue and the engine thread.

Concurrency contract
--------------------
* One engine thread owns the model, the KV cache, the slots and every sampler; nothing else calls
  llama.cpp for decoding.
* The asyncio side talks to it through `Scheduler.submit` (atomic admission check, may raise
  `QueueFullError`), `Ticket.cancel` and `Scheduler.stats`; all three only take a short lock.
* The engine hands events (`TextDelta`, then exactly one `Finished` or `Failed`) to each request's
  asyncio queue with `loop.call_soon_threadsafe`.
* A cancelled request leaves before the next decode step, so it costs at most one more token.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from backends.llamacpp.native import Batch, Model, NativeError, Sampler
from backends.llamacpp.sampling import SamplingParams
from backends.llamacpp.text import StopMatcher, Utf8Stream

log = logging.getLogger("voltgate.worker")

FinishReason = Literal["stop", "length", "cancelled"]

_THROUGHPUT_WINDOW_S = 10.0


@dataclass(frozen=True)
class GenerationRequest:
    """One tokenized request, ready for a slot."""

    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    usage: Usage


@dataclass(frozen=True)
class Failed:
    message: str
    retryable: bool = False  # True when the worker is shutting down, not when the request broke it


Event = TextDelta | Finished | Failed


class QueueFullError(Exception):
    """Every slot is busy and `max_queue` requests already wait for one."""


class SchedulerClosedError(Exception):
    """The engine has stopped (shutdown or a fatal llama.cpp error)."""


class Ticket:
    """The asyncio side of one submitted request: its event stream and its cancel switch."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]):
        self.request = request
        self._loop = loop
        self._wake = wake
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()

    async def next_event(self) -> Event:
        return await self._events.get()

    def cancel(self) -> None:
        """Ask the engine to drop this request (thread-safe, idempotent, a no-op once finished)."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def deliver(self, event: Event) -> None:
        """Called by the engine thread."""
        # RuntimeError: the event loop is closed, so nobody is listening any more.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)


@dataclass(frozen=True)
class SchedulerStats:
    slots: int
    slots_busy: int
    queue_depth: int
    kv_cells_used: int
    kv_cells_cached: int
    requests_total: int
    aborted_total: int
    prompt_tokens_total: int
    cached_prompt_tokens_total: int
    generation_tokens_total: int
    tokens_per_second: float


@dataclass
class _Slot:
    seq_id: int
    cached: list[int] = field(default_factory=list)  # tokens whose KV this sequence holds, by position
    last_used_s: float = 0.0
    busy: bool = False


class _Sequence:
    """Engine-thread state of one running request."""

    def __init__(self, ticket: Ticket, slot: _Slot, sampler: Sampler, reused: int, now_s: float) -> None:
        self.ticket = ticket
        self.request = ticket.request
        self.slot = slot
        self.sampler = sampler
        self.cached_tokens = reused
        self.started_s = now_s
        self.pending: int | None = None  # sampled, not yet decoded
        self.n_generated = 0
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(self.request.stop)

    @property
    def prefill_left(self) -> int:
        return len(self.request.prompt) - len(self.slot.cached)


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class Scheduler:
    """Runs every request on one model: `slots` sequences decode together, the rest wait in a FIFO.

    Each engine step decodes one token for every generating sequence plus as many pending prompt
    tokens as fit in `n_batch` (chunked prefill), so a new request starts while others stream.
    A free slot keeps its sequence's KV; a new prompt goes to the free slot sharing the longest
    prefix with it, and only the rest is prefilled.
    """

    def __init__(
        self,
        model: Model,
        *,
        slots: int,
        n_ctx_per_slot: int,
        n_batch: int,
        max_queue: int,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        if slots > n_batch:
            raise ValueError(f"slots ({slots}) must not exceed n_batch ({n_batch})")
        self._model = model
        self._n_ctx = n_ctx_per_slot
        self._n_batch = n_batch
        self._max_queue = max_queue
        self._on_fatal = on_fatal
        self._slots = [_Slot(seq_id=i) for i in range(slots)]
        self._running: list[_Sequence] = []  # admission order: prefill is first come, first served
        self._batch = Batch(n_batch)
        self._cond = threading.Condition()
        # guarded by _cond
        self._waiting: deque[Ticket] = deque()
        self._free_slots = slots
        self._closed = False
        self._counters = {"requests": 0, "aborted": 0, "prompt": 0, "cached": 0, "generated": 0}
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)
        self._kv_used = 0
        self._kv_cached = 0
        self._started_s = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="llama-engine", daemon=True)

    # --- asyncio side -----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Refuse new requests; the engine fails whatever is queued or running and exits (non-blocking)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def stop(self, timeout_s: float = 10.0) -> None:
        """`close`, then join the engine thread."""
        self.close()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def submit(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> Ticket:
        """Queue a request; raises `QueueFullError` when it would wait behind `max_queue` others."""
        ticket = Ticket(request, loop, self._wake)
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("the engine is not running")
            if len(self._waiting) >= self._max_queue + self._free_slots:
                raise QueueFullError(f"all {len(self._slots)} slots are busy and {self._max_queue} requests are queued")
            self._waiting.append(ticket)
            self._cond.notify()
        return ticket

    def stats(self) -> SchedulerStats:
        now = time.monotonic()
        with self._cond:
            self._trim_recent(now)
            window_s = min(_THROUGHPUT_WINDOW_S, max(now - self._started_s, 1e-3))
            c = self._counters
            return SchedulerStats(
                slots=len(self._slots),
                slots_busy=len(self._slots) - self._free_slots,
                queue_depth=len(self._waiting),
                kv_cells_used=self._kv_used,
                kv_cells_cached=self._kv_cached,
                requests_total=c["requests"],
                aborted_total=c["aborted"],
                prompt_tokens_total=c["prompt"],
                cached_prompt_tokens_total=c["cached"],
                generation_tokens_total=c["generated"],
                tokens_per_second=round(sum(n for _, n in self._recent) / window_s, 2),
            )

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # --- engine thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while self._next_round():
                self._step()
        except Exception as exc:  # a llama.cpp failure we cannot attribute to one request
            log.exception("engine failed")
            self._shutdown(f"engine failed: {exc}", retryable=False)
            if self._on_fatal is not None:
                self._on_fatal(str(exc))
            return
        self._shutdown("the worker is shutting down", retryable=True)

    def _next_round(self) -> bool:
        """Wait for work, admit queued requests into free slots, drop cancelled ones."""
        with self._cond:
            while not self._closed and not self._running and not self._waiting:
                self._cond.wait()
            if self._closed:
                return False
            for ticket in [t for t in self._waiting if t.cancelled]:
                self._waiting.remove(ticket)
                self._counters["requests"] += 1
                self._counters["aborted"] += 1
                self._log_abort(ticket.request, "while queued")
                ticket.deliver(Finished("cancelled", Usage(len(ticket.request.prompt), 0, 0)))
            admitted: list[Ticket] = []
            while self._waiting and self._free_slots > 0:
                admitted.append(self._waiting.popleft())
                self._free_slots -= 1
        for ticket in admitted:
            self._admit(ticket)
        for seq in [s for s in self._running if s.ticket.cancelled]:
            self._log_abort(seq.request, f"after {seq.n_generated} tokens")
            self._release(seq, Finished("cancelled", self._usage(seq)), aborted=True)
        return True

    def _admit(self, ticket: Ticket) -> None:
        prompt = ticket.request.prompt
        slot = max(
            (s for s in self._slots if not s.busy),
            key=lambda s: (common_prefix_len(s.cached, prompt), -s.last_used_s),
        )
        # Keep the shared prefix, but always prefill at least one token: its logits start generation.
        reuse = min(common_prefix_len(slot.cached, prompt), len(prompt) - 1)
        if reuse < len(slot.cached) and not self._model.seq_remove(slot.seq_id, reuse):
            self._model.seq_clear(slot.seq_id)
            reuse = 0
        del slot.cached[reuse:]
        slot.busy = True
        try:
            sampler = self._model.new_sampler(ticket.request.sampling)
        except NativeError as exc:
            slot.busy = False
            with self._cond:
                self._free_slots += 1
            ticket.deliver(Failed(str(exc)))
            return
        self._running.append(_Sequence(ticket, slot, sampler, reuse, time.monotonic()))
        self._update_kv_stats()

    def _step(self) -> None:
        batch = self._batch
        batch.clear()
        outputs: list[tuple[_Sequence, int]] = []
        chunks: list[tuple[_Sequence, list[int]]] = []
        for seq in self._running:
            if seq.pending is not None:
                pos = len(seq.slot.cached)
                outputs.append((seq, batch.add(seq.pending, pos, seq.slot.seq_id, logits=True)))
                chunks.append((seq, [seq.pending]))
        for seq in self._running:
            budget = batch.capacity - batch.n_tokens
            if seq.pending is not None or seq.prefill_left == 0 or budget == 0:
                continue
            start = len(seq.slot.cached)
            take = seq.request.prompt[start : start + min(budget, seq.prefill_left)]
            for offset, token in enumerate(take):
                pos = start + offset
                last = pos == len(seq.request.prompt) - 1
                index = batch.add(token, pos, seq.slot.seq_id, logits=last)
                if last:
                    outputs.append((seq, index))
            chunks.append((seq, list(take)))
        if batch.n_tokens == 0:
            return
        try:
            self._model.decode(batch)
        except NativeError as exc:
            log.error("decode of %d tokens failed: %s", batch.n_tokens, exc)
            for seq, _ in chunks:
                self._model.seq_clear(seq.slot.seq_id)
                seq.slot.cached.clear()
                self._release(seq, Failed(f"llama.cpp decode failed: {exc}"), aborted=False)
            return
        for seq, tokens in chunks:
            seq.slot.cached.extend(tokens)
            seq.pending = None
        generated = 0
        for seq, index in outputs:
            token = seq.sampler.sample(self._model, index)
            generated += 1
            self._on_token(seq, token)
        now = time.monotonic()
        with self._cond:
            self._counters["generated"] += generated
            self._recent.append((now, generated))
            self._trim_recent(now)
        self._update_kv_stats()

    def _on_token(self, seq: _Sequence, token: int) -> None:
        seq.n_generated += 1
        request = seq.request
        if self._model.is_eog(token) and not request.sampling.ignore_eos:
            self._finish(seq, "stop")
            return
        result = seq.stops.push(seq.utf8.push(self._model.piece(token)))
        if result.text:
            seq.ticket.deliver(TextDelta(result.text))
        out_of_tokens = request.max_tokens is not None and seq.n_generated >= request.max_tokens
        out_of_context = len(request.prompt) + seq.n_generated >= self._n_ctx
        if result.stopped:
            self._release(seq, Finished("stop", self._usage(seq)), aborted=False)
        elif out_of_tokens or out_of_context:
            self._finish(seq, "length")
        else:
            seq.pending = token

    def _finish(self, seq: _Sequence, reason: FinishReason) -> None:
        """End on EOS or a limit: release held-back text (which may still complete a stop string)."""
        result = seq.stops.push(seq.utf8.flush())
        text = result.text if result.stopped else result.text + seq.stops.flush()
        if text:
            seq.ticket.deliver(TextDelta(text))
        self._release(seq, Finished("stop" if result.stopped else reason, self._usage(seq)), aborted=False)

    def _release(self, seq: _Sequence, event: Finished | Failed, *, aborted: bool) -> None:
        """Free the slot (its KV stays cached for prefix reuse) and hand over the final event."""
        self._running.remove(seq)
        seq.sampler.close()
        seq.slot.busy = False
        seq.slot.last_used_s = time.monotonic()
        with self._cond:
            self._free_slots += 1
            c = self._counters
            c["requests"] += 1
            c["aborted"] += int(aborted)
            c["prompt"] += len(seq.request.prompt)
            c["cached"] += seq.cached_tokens
        self._update_kv_stats()
        if isinstance(event, Finished) and not aborted:
            log.info(
                "request %s done prompt=%d cached=%d completion=%d reason=%s in %.2fs",
                seq.request.request_id,
                len(seq.request.prompt),
                seq.cached_tokens,
                seq.n_generated,
                event.reason,
                time.monotonic() - seq.started_s,
            )
        elif isinstance(event, Failed):
            log.error("request %s failed: %s", seq.request.request_id, event.message)
        seq.ticket.deliver(event)

    def _usage(self, seq: _Sequence) -> Usage:
        return Usage(len(seq.request.prompt), seq.n_generated, seq.cached_tokens)

    def _log_abort(self, request: GenerationRequest, when: str) -> None:
        log.info("request %s aborted %s (client disconnected)", request.request_id, when)

    def _update_kv_stats(self) -> None:
        used = sum(len(s.cached) for s in self._slots if s.busy)
        cached = sum(len(s.cached) for s in self._slots if not s.busy)
        with self._cond:
            self._kv_used, self._kv_cached = used, cached

    def _trim_recent(self, now_s: float) -> None:
        while self._recent and self._recent[0][0] < now_s - _THROUGHPUT_WINDOW_S:
            self._recent.popleft()

    def _shutdown(self, message: str, *, retryable: bool) -> None:
        with self._cond:
            self._closed = True
            waiting = list(self._waiting)
            self._waiting.clear()
        for ticket in waiting:
            ticket.deliver(Failed(message, retryable))
        for seq in list(self._running):
            self._release(seq, Failed(message, retryable), aborted=False)
        self._batch.close()
