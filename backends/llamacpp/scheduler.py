"""Continuous batching over one llama.cpp context: slots, a bounded FIFO queue and the engine thread.

Concurrency contract
--------------------
* One engine thread owns the model, the KV cache, the slots and every sampler; nothing else calls
  llama.cpp for decoding.
* The asyncio side talks to it through `Scheduler.submit` (atomic admission check, may raise
  `QueueFullError`), `Ticket.cancel` and `Scheduler.stats`; all three only take a short lock.
* The engine hands events (`TextDelta`, then exactly one `Finished` or `Failed`) to each request's
  asyncio queue through an `Outbox`, flushed once per step right before the next decode (see
  `tickets` for why a courier thread wakes the event loop).
* A cancelled request leaves before the next decode step, so it costs at most one more token.

Batch layout
------------
With one KV stream per slot (non-unified KV), llama.cpp puts only sequences with *consecutive* ids, in
batch order, into one micro-batch, and every micro-batch is a full forward pass. So each step's batch is
written in slot order, new requests take the lowest free slot unless a long cached prefix says otherwise,
and with `fill_gaps` an idle slot between two busy ones gets a throwaway token (removed after the decode)
instead of splitting the step in two: nearly free on a GPU, a whole token's compute on a CPU.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from backends.llamacpp.native import Batch, Model, NativeError, Sampler
from backends.llamacpp.picking import Pick, TokenPicker
from backends.llamacpp.text import StopMatcher, Utf8Stream
from backends.llamacpp.tickets import (
    Event,
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    Outbox,
    TextDelta,
    Ticket,
    Usage,
)

log = logging.getLogger("voltgate.worker")

__all__ = [
    "Event",
    "Failed",
    "Finished",
    "GenerationRequest",
    "QueueFullError",
    "Scheduler",
    "SchedulerClosedError",
    "SchedulerStats",
    "TextDelta",
    "Ticket",
    "Usage",
]

_THROUGHPUT_WINDOW_S = 10.0

# A cached prefix shorter than this does not outweigh keeping busy slots contiguous (a BOS token or a
# chat template's first few tokens are shared by nearly every prompt).
_MIN_REUSE_TOKENS = 16


class QueueFullError(Exception):
    """Every slot is busy and `max_queue` requests already wait for one."""


class SchedulerClosedError(Exception):
    """The engine has stopped (shutdown or a fatal llama.cpp error)."""


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
    busy: bool = False


class _Sequence:
    """Engine-thread state of one running request."""

    def __init__(self, ticket: Ticket, slot: _Slot, sampler: Sampler | None, reused: int, model: Model) -> None:
        self.ticket = ticket
        self.request = ticket.request
        self.slot = slot
        self.sampler = sampler  # None: plain greedy, picked from the logits without a sampler chain
        self.banned = model.eog_ids if self.request.sampling.ignore_eos else frozenset()
        self.cached_tokens = reused
        self.started_s = time.monotonic()
        self.pending: int | None = None  # sampled, not yet decoded
        self.n_generated = 0
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(self.request.stop)

    @property
    def prefill_left(self) -> int:
        return len(self.request.prompt) - len(self.slot.cached)


class _Run(NamedTuple):
    """Consecutive tokens of one slot in a step's batch; `seq` None marks a gap filler."""

    slot: _Slot
    seq: _Sequence | None
    tokens: Sequence[int]
    logits: bool


def _run_order(run: _Run) -> int:
    return run.slot.seq_id


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
    prefix with it (if at least `_MIN_REUSE_TOKENS` long, else to the lowest free slot), and only the
    rest is prefilled. `fill_gaps`: see the module docstring. `sampling_threads`: see `picking`.
    """

    def __init__(
        self,
        model: Model,
        *,
        slots: int,
        n_ctx_per_slot: int,
        n_batch: int,
        max_queue: int,
        fill_gaps: bool = False,
        sampling_threads: int = 1,
        on_fatal: Callable[[str], None] | None = None,
    ) -> None:
        if slots > n_batch:
            raise ValueError(f"slots ({slots}) must not exceed n_batch ({n_batch})")
        self._model = model
        self._n_ctx = n_ctx_per_slot
        self._max_queue = max_queue
        self._fill_gaps = fill_gaps
        self._filler_token = max(model.bos_id, 0)
        self._on_fatal = on_fatal
        self._slots = [_Slot(seq_id=i) for i in range(slots)]
        self._running: list[_Sequence] = []  # admission order: prefill is first come, first served
        self._batch = Batch(n_batch)
        self._outbox = Outbox()
        self._picker = TokenPicker(model, min(sampling_threads, slots))
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
        self._outbox.start()
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
            if not self._closed and not self._running and not self._waiting:
                self._outbox.flush()
                while not self._closed and not self._running and not self._waiting:
                    self._cond.wait()
            if self._closed:
                return False
            for ticket in [t for t in self._waiting if t.cancelled]:
                self._waiting.remove(ticket)
                self._counters["requests"] += 1
                self._counters["aborted"] += 1
                self._log_abort(ticket.request, "while queued")
                self._outbox.put(ticket, Finished("cancelled", Usage(len(ticket.request.prompt), 0, 0)))
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

    def _pick_slot(self, prompt: Sequence[int]) -> _Slot:
        best: _Slot | None = None
        best_reuse = -1
        for slot in self._slots:  # ascending ids: on equal reuse the lowest free slot wins
            if slot.busy:
                continue
            reuse = common_prefix_len(slot.cached, prompt)
            if reuse < _MIN_REUSE_TOKENS:
                reuse = 0
            if reuse > best_reuse:
                best, best_reuse = slot, reuse
        assert best is not None, "admitted without a free slot"
        return best

    def _admit(self, ticket: Ticket) -> None:
        prompt = ticket.request.prompt
        slot = self._pick_slot(prompt)
        # Keep the shared prefix, but always prefill at least one token: its logits start generation.
        reuse = min(common_prefix_len(slot.cached, prompt), len(prompt) - 1)
        if reuse < len(slot.cached) and not self._model.seq_remove(slot.seq_id, reuse):
            self._model.seq_clear(slot.seq_id)
            reuse = 0
        del slot.cached[reuse:]
        slot.busy = True
        sampling = ticket.request.sampling
        try:
            sampler = None if sampling.plain_greedy else self._model.new_sampler(sampling)
        except NativeError as exc:
            slot.busy = False
            with self._cond:
                self._free_slots += 1
            self._outbox.put(ticket, Failed(str(exc)))
            return
        self._running.append(_Sequence(ticket, slot, sampler, reuse, self._model))
        self._update_kv_stats()

    def _plan(self) -> list[_Run]:
        """This step's batch, in slot order: every pending token, then prompt chunks first come first
        served, then (with `fill_gaps`) a filler for each idle slot between two that take part."""
        capacity = self._batch.capacity
        runs = [_Run(s.slot, s, (s.pending,), True) for s in self._running if s.pending is not None]
        used = len(runs)
        # Leave room for fillers, but never starve prefill completely.
        reserve = max(0, min(len(self._slots) - 1, capacity - used - 1)) if self._fill_gaps else 0
        for seq in self._running:
            budget = capacity - used - reserve
            if budget <= 0:
                break
            if seq.pending is not None or seq.prefill_left == 0:
                continue
            prompt = seq.request.prompt
            start = len(seq.slot.cached)
            end = start + min(budget, len(prompt) - start)
            runs.append(_Run(seq.slot, seq, prompt[start:end], end == len(prompt)))
            used += end - start
        if self._fill_gaps and len(runs) > 1:
            runs += self._fillers(runs, capacity - used)
        runs.sort(key=_run_order)
        return runs

    def _fillers(self, runs: list[_Run], room: int) -> list[_Run]:
        present = {run.slot.seq_id for run in runs}
        fillers: list[_Run] = []
        for seq_id in range(min(present), max(present)):
            slot = self._slots[seq_id]
            if seq_id in present or len(slot.cached) >= self._n_ctx:
                continue
            if len(fillers) == room:
                break
            fillers.append(_Run(slot, None, (self._filler_token,), False))
        return fillers

    def _step(self) -> None:
        batch = self._batch
        batch.clear()
        runs = self._plan()
        outputs: list[tuple[_Sequence, int, int]] = []  # (sequence, batch index, logits row)
        for run in runs:
            index = batch.add_run(run.tokens, len(run.slot.cached), run.slot.seq_id, logits=run.logits)
            if run.seq is not None and run.logits:
                outputs.append((run.seq, index, batch.n_outputs - 1))
        # The asyncio side handles the previous step's events while llama_decode runs without the GIL.
        self._outbox.flush()
        if not runs:
            return
        try:
            self._model.decode(batch)
        except NativeError as exc:
            log.error("decode of %d tokens failed: %s", batch.n_tokens, exc)
            self._drop_fillers(runs)
            for run in runs:
                if run.seq is not None:
                    self._model.seq_clear(run.slot.seq_id)
                    run.slot.cached.clear()
                    self._release(run.seq, Failed(f"llama.cpp decode failed: {exc}"), aborted=False)
            return
        self._drop_fillers(runs)
        for run in runs:
            if run.seq is not None:
                run.slot.cached.extend(run.tokens)
                run.seq.pending = None
        if outputs:
            picks = [Pick(seq.sampler, seq.banned, index, row) for seq, index, row in outputs]
            for (seq, _, _), token in zip(outputs, self._picker.pick(picks, batch.n_outputs), strict=True):
                self._on_token(seq, token)
        now = time.monotonic()
        with self._cond:
            self._counters["generated"] += len(outputs)
            self._recent.append((now, len(outputs)))
            self._trim_recent(now)
        self._update_kv_stats()

    def _drop_fillers(self, runs: list[_Run]) -> None:
        for run in runs:
            if run.seq is None and not self._model.seq_remove(run.slot.seq_id, len(run.slot.cached)):
                self._model.seq_clear(run.slot.seq_id)
                run.slot.cached.clear()

    def _on_token(self, seq: _Sequence, token: int) -> None:
        seq.n_generated += 1
        request = seq.request
        if self._model.is_eog(token) and not request.sampling.ignore_eos:
            self._finish(seq, "stop")
            return
        result = seq.stops.push(seq.utf8.push(self._model.piece(token)))
        if result.text:
            self._outbox.put(seq.ticket, TextDelta(result.text))
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
            self._outbox.put(seq.ticket, TextDelta(text))
        self._release(seq, Finished("stop" if result.stopped else reason, self._usage(seq)), aborted=False)

    def _release(self, seq: _Sequence, event: Finished | Failed, *, aborted: bool) -> None:
        """Free the slot (its KV stays cached for prefix reuse) and hand over the final event."""
        self._running.remove(seq)
        if seq.sampler is not None:
            seq.sampler.close()
        seq.slot.busy = False
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
        self._outbox.put(seq.ticket, event)

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
            self._outbox.put(ticket, Failed(message, retryable))
        for seq in list(self._running):
            self._release(seq, Failed(message, retryable), aborted=False)
        self._picker.close()
        self._outbox.close()
