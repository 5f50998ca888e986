"""Continuous batching over one llama.cpp context: slots, a bounded FIFO queue and the engine thread.

Concurrency contract
--------------------
* One engine thread owns the model, the KV cache, the slots and every sampler; nothing else calls
  llama.cpp for decoding.
* The asyncio side talks to it through `Scheduler.submit`/`submit_group` (atomic admission check, may
  raise `QueueFullError`), `Ticket.cancel` and `Scheduler.stats`; all of them only take a short lock.
* The engine hands events (`Started` if asked, `TextDelta`s, then one `Finished` or `Failed`) to each
  request's queue through an `Outbox`, flushed once per step before the next decode (`tickets` says why).
* A cancelled request leaves before the next decode step, so it costs at most one more token.

Batch layout
------------
With one KV stream per slot (non-unified KV), llama.cpp puts only sequences with *consecutive* ids, in
batch order, into one micro-batch, and every micro-batch is a full forward pass. So each step's batch is
written in slot order, new requests take the lowest free slot unless a long cached prefix says otherwise,
and with `fill_gaps` an idle slot between two busy ones gets a throwaway token (removed after the decode)
instead of splitting the step in two: nearly free on a GPU, a whole token's compute on a CPU.

Groups (`n` > 1)
----------------
The members of a group share one prompt. Those admitted in one round (as many as there are free slots)
are prefilled once: the first prefills, the others wait parked, and when its last prompt token is decoded
each gets a copy of its KV (`Model.seq_copy`: with non-unified KV, a copy of the whole stream, done by
llama.cpp at the start of the next decode) and samples from the same logits row with its own sampler.
A member admitted later, once the prompt is in a running member's KV, copies that KV, drops the last
prompt token and decodes just that one again, for its logits. Without a running member it is an ordinary
request (a free slot may still hold the prompt for prefix reuse).

Images: see `image_step` (evaluated alone before each step's batch; text-only requests never meet them).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Sequence

from backends.llamacpp.worker.checkpoints import Checkpointer, CheckpointStore, uncut
from backends.llamacpp.worker.engine_stats import EngineCounters, SchedulerStats
from backends.llamacpp.worker.image_step import ImageEvaluator, eval_images
from backends.llamacpp.worker.native import Batch, Model, NativeError
from backends.llamacpp.worker.picking import Pick, TokenPicker
from backends.llamacpp.worker.prompt_cache import HostPrompts, PromptCache, SavePolicy
from backends.llamacpp.worker.sampler import Sampler
from backends.llamacpp.worker.slots import Origin, Run, SeqState, Slot, common_prefix_len, fillers, run_order, take_slot
from backends.llamacpp.worker.slow_lane import DEFAULT_GRAMMAR_STEP_LIMIT_S, SlowLane, is_heavy
from backends.llamacpp.worker.tickets import (
    Failed,
    Finished,
    FinishReason,
    GenerationRequest,
    Outbox,
    QueueFullError,
    SchedulerClosedError,
    Started,
    Ticket,
    TokenLogprob,
    Usage,
)
from backends.llamacpp.worker.waiting import WaitingQueue

log = logging.getLogger("voltgate.worker")

__all__ = ["QueueFullError", "Scheduler", "SchedulerClosedError", "SchedulerStats"]


class Scheduler:
    """Runs every request on one model: `slots` sequences decode together, the rest wait in a FIFO.

    Each engine step decodes one token for every generating sequence plus as many pending prompt
    tokens as fit in `n_batch` (chunked prefill), so a new request starts while others stream.
    A free slot keeps its sequence's KV; a new prompt goes to the free slot that keeps the most cached
    work (`slots.pick_slot`: the longest shared prefix, less the cached tokens it overwrites, a loss weighed
    by how recently the slot was used), and only the rest is prefilled. KV that a prompt overwrites may be
    saved to host memory and loaded back (`prompt_cache`). `fill_gaps`: the module docstring; `sampling_threads`:
    `picking`; `ctx_checkpoints`: per slot, for a recurrent or hybrid model only (`checkpoints`: a dense one
    gets no `_ckpt`, so every hook is skipped); 0 = off.
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
        images: ImageEvaluator | None = None,
        prompt_cache: PromptCache | None = None,
        save_policy: SavePolicy | None = None,
        ctx_checkpoints: int = 0,
        grammar_step_limit_s: float = DEFAULT_GRAMMAR_STEP_LIMIT_S,
    ) -> None:
        if slots > n_batch:
            raise ValueError(f"slots ({slots}) must not exceed n_batch ({n_batch})")
        self._model = model
        self._n_ctx = n_ctx_per_slot
        self._max_queue = max_queue
        self._fill_gaps = fill_gaps
        self._filler_token = max(model.bos_id, 0)
        self._on_fatal = on_fatal
        self._images = images
        store = CheckpointStore(ctx_checkpoints if model.recurrent else 0, recurrent=model.recurrent)
        policy = save_policy or SavePolicy()
        self._ckpt = Checkpointer(model, store, n_batch, policy.long_prompt_tokens) if store.limit else None
        self._host = HostPrompts(model, prompt_cache or PromptCache(0), policy, store)  # see `prompt_cache`
        self._slots = [Slot(seq_id=i) for i in range(slots)]
        self._running: list[SeqState] = []  # admission order: prefill is first come, first served
        self._batch = Batch(n_batch)
        self._outbox = Outbox()
        self._picker = TokenPicker(model, min(sampling_threads, slots))
        self._slow = SlowLane(model, self._wake, grammar_step_limit_s)  # heavy grammars sample off the step
        self._cond = threading.Condition()
        # guarded by _cond
        self._waiting = WaitingQueue()
        self._free_slots = slots
        self._closed = False
        self._counters = EngineCounters()
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
        return self.submit_group([request], loop)[0]

    def submit_group(self, requests: Sequence[GenerationRequest], loop: asyncio.AbstractEventLoop) -> list[Ticket]:
        """Queue the `n` choices of one prompt as a group, all or none; one ticket per request, in order.

        Raises `QueueFullError` unless every member fits (a group larger than `slots + max_queue` never
        does) and `ValueError` unless all share one prompt. Each member samples with its own settings
        (give each its own seed). The members' prompt is prefilled once per admission round (see the
        module docstring); each ticket's `Usage` reports the whole prompt, and its `cached_tokens` the
        part that member did not prefill itself, so the group's usage is the first ticket's prompt and
        cached tokens plus every ticket's completion tokens.
        """
        if not requests or any(r.prompt != requests[0].prompt for r in requests):
            raise ValueError("a group needs at least one request, and all of them share one prompt")
        tickets = [Ticket(request, loop, self._wake) for request in requests]
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("the engine is not running")
            if len(self._waiting) + len(tickets) > self._max_queue + self._free_slots:
                raise QueueFullError(
                    f"{len(tickets)} more requests do not fit: {len(self._slots)} slots, "
                    f"{len(self._slots) - self._free_slots} busy, {len(self._waiting)} of {self._max_queue} queued"
                )
            self._waiting.push(tickets)
            self._cond.notify()
        return tickets

    def stats(self) -> SchedulerStats:
        saved = self._host.cache.stats()  # ints the engine thread updates: a snapshot, like the rest
        points, now = self._host.checkpoints.stats(), time.monotonic()
        with self._cond:
            busy, queued = len(self._slots) - self._free_slots, len(self._waiting)
            return self._counters.snapshot(
                now, slots=len(self._slots), busy=busy, queued=queued, prompt_cache=saved, checkpoints=points
            )

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # --- engine thread: admission -----------------------------------------------------------------

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
        """Wait for work, admit queued requests into free slots, drop cancelled ones, take the tokens the
        slow lane picked."""
        with self._cond:
            if self._resting():
                self._outbox.flush()
                self._rest()
            if self._closed:
                return False
            for ticket in self._waiting.drop_cancelled():
                self._counters.ended(aborted=True, prompt=0, cached=0)
                log.info("request %s aborted while queued (client disconnected)", ticket.request.request_id)
                self._outbox.put(ticket, Finished("cancelled", Usage(len(ticket.request.prompt), 0, 0)))
            admitted = self._waiting.take(self._free_slots)
            self._free_slots -= len(admitted)
        for key, ticket in admitted:
            self._admit(ticket, key)
        for seq in [s for s in self._running if s.ticket.cancelled]:
            log.info("request %s aborted after %d tokens (client gone)", seq.request.request_id, seq.n_generated)
            self._release(seq, Finished("cancelled", seq.usage()), aborted=True)
        self._take_slow_tokens()
        return True

    def _resting(self) -> bool:
        """Nothing to do until a request, a cancellation or a slow-lane token comes (under `_cond`): every
        running sequence, if any, waits for its slow-lane token."""
        if self._closed or self._waiting or self._slow.has_done():
            return False
        return all(self._slow.holds(s) and not s.ticket.cancelled for s in self._running)

    def _take_slow_tokens(self) -> None:
        for done in self._slow.collect():
            seq = done.seq
            if seq not in self._running:  # released while its job ran: the sampler was left to the job
                if seq.sampler is not None:
                    seq.sampler.close()
            elif done.error is not None:
                self._release(seq, done.failure(), aborted=False)
            else:
                self._on_token(seq, done.token, done.entry)

    def _rest(self) -> None:
        """Under `_cond`, until there is work: once nothing has run or waited for `idle_after_s`
        (`prompt_cache.SavePolicy`), copy the free slots worth keeping to host memory, one at a time and
        with `_cond` released (a request that arrives meanwhile waits for one copy at most)."""
        due = None if self._running else self._host.idle_save_due(self._slots, time.monotonic())
        while self._resting():
            left = None if due is None else due - time.monotonic()
            if left is None or left > 0:
                self._cond.wait(left)
                continue
            due = None
            self._cond.release()
            try:
                while self._idle() and self._host.save_idle(self._slots):
                    pass
            finally:
                self._cond.acquire()

    def _idle(self) -> bool:
        with self._cond:
            return not (self._closed or self._running or self._waiting)

    def _admit(self, ticket: Ticket, group: int) -> None:
        prompt = ticket.request.prompt
        slot = take_slot(self._slots, prompt, self._host.precious)
        self._host.prepare(slot, prompt)  # saves the slot's KV it overwrites, or loads a longer saved prefix
        # Keep the shared prefix, but always prefill at least one token: its logits start generation.
        shared = min(common_prefix_len(slot.cached, prompt), len(prompt) - 1)
        reuse = self._trim(slot, ticket.request.reusable(shared))
        slot.origin = Origin(len(prompt), reuse, ticket.request.session_key)
        slot.busy = True
        sampling = ticket.request.sampling
        heavy = is_heavy(sampling)  # its sampler is built and run by the slow lane
        try:
            self._slow.check(sampling)  # a heavy grammar over the time bound before: refused at once
            sampler = None if sampling.plain_greedy or heavy else Sampler(self._model, sampling)
        except NativeError as exc:
            slot.busy = False
            with self._cond:
                self._free_slots += 1
            self._outbox.put(ticket, Failed(str(exc), invalid=exc.client_error))
            return
        seq = SeqState(ticket, slot, sampler, self._model, group=group, cached_tokens=reuse)
        seq.slow = heavy
        mate = self._mate(group)
        if mate is not None and mate.prefilling:  # prefilled once: wait for the leader's KV and logits
            seq.leader = mate
            mate.followers.append(seq)
        elif mate is not None:  # the prompt is in a mate's KV: copy it, decode only the last prompt token
            self._model.seq_copy(mate.slot.seq_id, slot.seq_id)
            slot.cached[:] = mate.slot.cached
            if self._ckpt is not None:  # the copy happens at the next decode: nothing to restore over yet
                self._ckpt.store.clear(slot.seq_id)
            seq.cached_tokens = self._trim(slot, len(prompt) - 1)
        self._running.append(seq)
        self._update_kv_stats()
        if ticket.request.report_start:
            self._outbox.put(ticket, Started(seq.usage()))

    def _trim(self, slot: Slot, keep: int) -> int:
        """Cut a slot's KV to its first `keep` positions (else to a checkpoint, or all: `uncut`); what is kept."""
        if keep < len(slot.cached) and not self._model.seq_remove(slot.seq_id, keep):
            keep = uncut(self._model, self._ckpt, slot.seq_id, keep)
        del slot.cached[keep:]
        if self._ckpt is not None:
            self._ckpt.store.cut(slot.seq_id, keep)
        return keep

    def _mate(self, group: int) -> SeqState | None:
        """A running member of `group` that is not parked: one still prefilling if any."""
        mates = [s for s in self._running if s.group == group and s.leader is None]
        return next((s for s in mates if s.prefilling), mates[0] if mates else None)

    # --- engine thread: steps ---------------------------------------------------------------------

    def _plan(self) -> list[Run]:
        """This step's batch, in slot order: every pending token, then prompt chunks first come first
        served, then (with `fill_gaps`) a filler for each idle slot between two that take part."""
        capacity = self._batch.capacity
        runs = [Run(s.slot, s, (s.pending,), True) for s in self._running if s.pending is not None]
        used = len(runs)
        # Leave room for fillers, but never starve prefill completely.
        reserve = max(0, min(len(self._slots) - 1, capacity - used - 1)) if self._fill_gaps else 0
        for seq in self._running:
            budget = capacity - used - reserve
            if budget <= 0:
                break
            if not seq.prefilling:
                continue
            prompt = seq.request.prompt
            start = len(seq.slot.cached)
            stop = seq.request.text_end(start)  # text up to the next image (evaluated before the batch)
            if stop == start:
                continue
            end = start + min(budget, stop - start)
            if self._ckpt is not None:  # end the chunk where a checkpoint is due
                end = self._ckpt.chunk_end(len(prompt), start, end)
            runs.append(Run(seq.slot, seq, prompt[start:end], end == len(prompt)))
            used += end - start
        if self._fill_gaps and len(runs) > 1:
            runs += fillers(self._slots, runs, capacity - used, self._n_ctx, self._filler_token)
        runs.sort(key=run_order)
        return runs

    def _step(self) -> None:
        image_tokens = self._eval_images()
        batch = self._batch
        batch.clear()
        runs = self._plan()
        outputs: list[tuple[SeqState, int, int]] = []  # (sequence, batch index, logits row)
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
            self._decode_failed(runs, exc)
            return
        self._drop_fillers(runs)
        prefilled = image_tokens
        for run in runs:
            if run.seq is not None:
                prefilled += len(run.tokens) if run.seq.pending is None else 0
                run.slot.cached.extend(run.tokens)
                run.seq.pending = None
        if self._ckpt is not None:
            self._ckpt.after_decode(runs)
        outputs += self._hand_over_prompts(outputs)
        if outputs:
            self._pick(outputs, batch.n_outputs)
        with self._cond:
            self._counters.step(time.monotonic(), len(outputs), prefilled)
        self._update_kv_stats()

    def _eval_images(self) -> int:
        """The image step (`image_step`); the image tokens decoded (counted with the step's prefill)."""
        decoded, failed = eval_images(self._running, self._images, self._model, self._outbox.flush)
        for seq, message in failed:
            self._release(seq, Failed(message), aborted=False)
        return decoded

    def _hand_over_prompts(self, outputs: list[tuple[SeqState, int, int]]) -> list[tuple[SeqState, int, int]]:
        """Leaders whose prompt was just decoded give their parked followers its KV and logits row."""
        handed: list[tuple[SeqState, int, int]] = []
        for leader, index, row in outputs:
            for follower in leader.followers:
                self._model.seq_copy(leader.slot.seq_id, follower.slot.seq_id)
                follower.slot.cached[:] = leader.slot.cached
                if self._ckpt is not None:  # the leader's checkpoints hold the same tokens' states
                    self._ckpt.store.replace(follower.slot.seq_id, self._ckpt.store.of(leader.slot.seq_id))
                follower.cached_tokens = len(follower.request.prompt)
                follower.leader = None
                handed.append((follower, index, row))
            leader.followers.clear()
        return handed

    def _pick(self, outputs: list[tuple[SeqState, int, int]], n_outputs: int) -> None:
        slow = [(seq, row) for seq, _, row in outputs if seq.slow and not seq.forced]  # forced: no sampling
        if slow:
            logits = self._model.logits(n_outputs)
            for seq, row in slow:
                self._slow.submit(seq, logits[row])
        outputs = [output for output in outputs if not output[0].slow or output[0].forced]
        picks = [
            Pick(seq.sampler, seq.banned, i, row, seq.request.logprobs, seq.request.sampling.temperature, seq.forced)
            for seq, i, row in outputs
        ]
        for (seq, _, _), (token, entry) in zip(outputs, self._picker.pick(picks, n_outputs), strict=True):
            self._on_token(seq, token, entry)

    def _decode_failed(self, runs: list[Run], exc: NativeError) -> None:
        log.error("decode of %d tokens failed: %s", self._batch.n_tokens, exc)
        self._drop_fillers(runs)
        for run in runs:
            if run.seq is not None:
                self._model.seq_clear(run.slot.seq_id)
                run.slot.cached.clear()
                self._host.checkpoints.clear(run.slot.seq_id)
                self._release(run.seq, Failed(f"llama.cpp decode failed: {exc}"), aborted=False)

    def _drop_fillers(self, runs: list[Run]) -> None:
        """Remove the fillers' tokens (a recurrent state took one in: back to a checkpoint or cleared, `uncut`)."""
        for run in runs:
            if run.seq is None and not self._model.seq_remove(run.slot.seq_id, len(run.slot.cached)):
                del run.slot.cached[uncut(self._model, self._ckpt, run.slot.seq_id, len(run.slot.cached)) :]
                self._host.checkpoints.cut(run.slot.seq_id, len(run.slot.cached))

    def _on_token(self, seq: SeqState, token: int, entry: TokenLogprob | None) -> None:
        seq.n_generated += 1
        request = seq.request
        if self._model.is_eog(token) and not request.sampling.ignore_eos:
            self._finish(seq, "stop")
            return
        emitted = seq.push(self._model.piece(token, special=token in request.shown_specials), entry)
        delta = emitted.delta()
        if delta is not None:
            self._outbox.put(seq.ticket, delta)
        out_of_tokens = request.max_tokens is not None and seq.n_generated >= request.max_tokens
        out_of_context = len(request.prompt) + seq.n_generated >= self._n_ctx
        if emitted.matched is not None:
            self._release(seq, Finished("stop", seq.usage(), emitted.matched), aborted=False)
        elif out_of_tokens or out_of_context:
            self._finish(seq, "length")
        else:
            seq.pending = token

    def _finish(self, seq: SeqState, reason: FinishReason) -> None:
        """End on EOS or a limit: release held-back text (which may still complete a stop string)."""
        emitted = seq.flush()
        delta = emitted.delta()
        if delta is not None:
            self._outbox.put(seq.ticket, delta)
        finished = Finished("stop" if emitted.stopped else reason, seq.usage(), emitted.matched)
        self._release(seq, finished, aborted=False)

    def _release(self, seq: SeqState, event: Finished | Failed, *, aborted: bool) -> None:
        """Free the slot (its KV stays cached for prefix reuse) and hand over the final event."""
        self._running.remove(seq)
        seq.leave_group()
        if seq.sampler is not None and not self._slow.holds(seq):  # else the job's result closes it
            seq.sampler.close()
        seq.slot.busy = False
        with self._cond:
            self._free_slots += 1
            self._counters.ended(aborted=aborted, prompt=len(seq.request.prompt), cached=seq.cached_tokens)
        self._update_kv_stats()
        if isinstance(event, Finished) and not aborted:
            done, r = "request %s done prompt=%d cached=%d completion=%d reason=%s in %.2fs", seq.request
            log.info(done, r.request_id, len(r.prompt), seq.cached_tokens, seq.n_generated, event.reason,
                     time.monotonic() - seq.started_s)  # fmt: skip
        elif isinstance(event, Failed):
            log.error("request %s failed: %s", seq.request.request_id, event.message)
        self._outbox.put(seq.ticket, event)

    def _update_kv_stats(self) -> None:
        used = sum(len(s.cached) for s in self._slots if s.busy)
        cached = sum(len(s.cached) for s in self._slots if not s.busy)
        with self._cond:
            self._counters.kv(used, cached)

    def _shutdown(self, message: str, *, retryable: bool) -> None:
        with self._cond:
            self._closed = True
            waiting = self._waiting.drain()
        for ticket in waiting:
            self._outbox.put(ticket, Failed(message, retryable))
        for seq in list(self._running):
            self._release(seq, Failed(message, retryable), aborted=False)
        for done in self._slow.close():  # every sequence is released: close the samplers their jobs had
            if done.seq.sampler is not None:
                done.seq.sampler.close()
        self._picker.close()
        self._outbox.close()
