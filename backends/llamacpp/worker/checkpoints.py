"""Context checkpoints: prefix reuse for recurrent and hybrid models (llama-server's `--ctx-checkpoints`).

A recurrent layer (Mamba2, a gated delta net) keeps one fixed state per sequence, the sum of every token
so far; llama.cpp cannot cut it back to an earlier position (`llama_memory_seq_rm` fails), so without
help the scheduler clears a slot whose new prompt diverges anywhere before the slot's end and prefills the
whole prompt again. An agent resends its 5-30k-token context plus a few new tokens every turn, and the
template re-renders the previous answer, so the shared prefix ends inside the cached tokens: every turn
would be a full prefill.

So while a prompt is prefilled, the slot's *partial* state (`LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY`: the
recurrent part only, a small fixed size per sequence, not the attention KV) is copied to host memory at
chosen positions (`targets`). When a later prompt needs the slot cut at `keep` and llama.cpp refuses, the
newest checkpoint at or before `keep` is loaded back over the recurrent state and the attention KV is cut
after its position: attention KV can be cut anywhere, and llama.cpp's hybrid memory cuts the recurrent
part first, which succeeds once the restored state ends before the cut (its cell then lies before it).

Where (`targets`): like llama-server, `TAIL` tokens before the end of the prompt and one batch before
that. The last prompt token must be decoded again for its logits, so a checkpoint at the very end could
never serve a repeat of the same prompt (the scheduler keeps at most `len(prompt) - 1`); one a few tokens
earlier serves it, and serves a next turn whose template re-renders the last few tokens (the generation
prompt). The one a batch earlier serves a next turn that differs further back in the tail, and stays
behind when the later one is cut. A prompt chunk is ended at each target so the state there exists.

Bounded: at most `limit` per slot, the newest kept; those after a cut position go with the cut. The
scheduler only builds a `Checkpointer` for a model that is recurrent or hybrid and a limit above 0: a dense
model takes exactly the path it took before (no per-step or per-request work).

Engine thread only, like `slots`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.llamacpp.worker.slots import MIN_REUSE_TOKENS

if TYPE_CHECKING:  # the choice logic runs without llama.cpp loaded (its unit tests stay native-free)
    from backends.llamacpp.worker.native import Model
    from backends.llamacpp.worker.slots import Run

log = logging.getLogger("voltgate.worker")

# Per slot; each costs one sequence's recurrent state in host memory. A turn makes two; the next turn cuts
# back to the later one and adds two: four keep a turn and its predecessor.
DEFAULT_CTX_CHECKPOINTS = 4
TAIL = 4  # the last checkpoint this many tokens before the prompt's end (llama-server's choice too)


@dataclass(frozen=True)
class Checkpoint:
    pos: int  # the prompt tokens the state has taken in: it resumes decoding at this position
    state: bytearray  # `Model.seq_partial_save`'s bytes (never modified: entries may share it)


@dataclass(frozen=True)
class CheckpointStats:
    limit: int  # per slot; 0: off (or a dense model)
    entries: int
    bytes: int
    saved_total: int
    restored_total: int
    restored_tokens_total: int  # prompt tokens not prefilled again thanks to a restore
    save_seconds_total: float


def targets(prompt_len: int, n_batch: int) -> tuple[int, ...]:
    """Positions at which a prompt of `prompt_len` tokens is checkpointed, ascending (none under
    `MIN_REUSE_TOKENS`: too short a prefix to be worth a copy)."""
    tail = prompt_len - TAIL
    return tuple(p for p in (tail - n_batch, tail) if p >= MIN_REUSE_TOKENS)


def chunk_end(prompt_len: int, n_batch: int, start: int, end: int) -> int:
    """A prefill chunk [start, end) ended at the first target inside it, so the state there exists."""
    return next((p for p in targets(prompt_len, n_batch) if start < p < end), end)


def choose(checkpoints: Sequence[Checkpoint], keep: int) -> Checkpoint | None:
    """The checkpoint that keeps the most, at most `keep` (the scheduler's `keep` already leaves at least
    one prompt token to decode)."""
    fitting = [c for c in checkpoints if 0 < c.pos <= keep]
    return max(fitting, key=lambda c: c.pos) if fitting else None


def reachable(n_cached: int, checkpoints: Sequence[Checkpoint], keep: int) -> int:
    """What a sequence of `n_cached` tokens still holds once cut at `keep`: all `keep` if nothing is cut,
    else back to the checkpoint `choose` finds, else nothing."""
    if keep >= n_cached:
        return keep
    found = choose(checkpoints, keep)
    return 0 if found is None else found.pos


def added(checkpoints: Sequence[Checkpoint], new: Checkpoint, limit: int) -> list[Checkpoint]:
    """`checkpoints` with `new` (one at the same position replaced), the oldest dropped past `limit`."""
    kept = sorted([*(c for c in checkpoints if c.pos != new.pos), new], key=lambda c: c.pos)
    return kept[-limit:] if limit > 0 else []


def cut(checkpoints: Sequence[Checkpoint], keep: int) -> list[Checkpoint]:
    """The checkpoints still valid once the slot holds only its first `keep` tokens."""
    return [c for c in checkpoints if c.pos <= keep]


class CheckpointStore:
    """Each slot's checkpoints, by sequence id, and the counters `/health` shows."""

    def __init__(self, limit: int, *, recurrent: bool = False) -> None:
        self.limit = max(0, limit)
        self.recurrent = recurrent  # the model's sequences cannot be cut back (checkpoints or not)
        self._by_seq: dict[int, list[Checkpoint]] = {}
        self._held = (0, 0)  # entries, bytes: ints `stats` may read from another thread
        self.saved = 0
        self.restored = 0
        self.restored_tokens = 0
        self.save_s = 0.0

    def of(self, seq_id: int) -> tuple[Checkpoint, ...]:
        return tuple(self._by_seq.get(seq_id, ()))

    def put(self, seq_id: int, checkpoint: Checkpoint) -> None:
        self._set(seq_id, added(self._by_seq.get(seq_id, ()), checkpoint, self.limit))

    def replace(self, seq_id: int, checkpoints: Sequence[Checkpoint]) -> None:
        """The slot now holds other tokens (a copy or a host-memory restore): these are its checkpoints."""
        self._set(seq_id, sorted(checkpoints, key=lambda c: c.pos)[-self.limit :] if self.limit else [])

    def cut(self, seq_id: int, keep: int) -> None:
        if seq_id in self._by_seq:
            self._set(seq_id, cut(self._by_seq[seq_id], keep))

    def clear(self, seq_id: int) -> None:
        if self._by_seq.pop(seq_id, None) is not None:
            self._set(seq_id, [])

    def _set(self, seq_id: int, checkpoints: list[Checkpoint]) -> None:
        self._by_seq[seq_id] = checkpoints
        every = [c for cs in self._by_seq.values() for c in cs]
        self._held = (len(every), sum({id(c.state): len(c.state) for c in every}.values()))  # copies share

    def stats(self) -> CheckpointStats:
        return CheckpointStats(
            self.limit,
            *self._held,
            self.saved,
            self.restored,
            self.restored_tokens,
            round(self.save_s, 6),
        )


class Checkpointer:
    """The scheduler's hooks for a recurrent or hybrid model (see the module docstring)."""

    def __init__(self, model: Model, store: CheckpointStore, n_batch: int, min_prompt: int = 0) -> None:
        self._model = model
        self.store = store
        self._n_batch = n_batch
        # Shorter prompts are not checkpointed: on a GPU the state's copy to host memory costs about what
        # a short prompt's prefill does (the prompt cache's `SavePolicy.long_prompt_tokens`, same reason).
        self._min_prompt = min_prompt

    def chunk_end(self, prompt_len: int, start: int, end: int) -> int:
        return end if prompt_len < self._min_prompt else chunk_end(prompt_len, self._n_batch, start, end)

    def after_decode(self, runs: Sequence[Run]) -> None:
        """Checkpoint each text-only prompt whose prefill just reached one of its targets."""
        for run in runs:
            seq = run.seq
            if seq is None or seq.request.images or len(seq.request.prompt) < self._min_prompt:
                continue
            pos = len(run.slot.cached)
            if pos in targets(len(seq.request.prompt), self._n_batch):
                self._save(run.slot.seq_id, pos)

    def _save(self, seq_id: int, pos: int) -> None:
        started = time.perf_counter()
        state = self._model.seq_partial_save(seq_id)
        if state is None:
            log.warning("slot %d: the checkpoint at position %d failed", seq_id, pos)
            return
        self.store.put(seq_id, Checkpoint(pos, state))
        self.store.saved += 1
        self.store.save_s += time.perf_counter() - started

    def restore(self, seq_id: int, keep: int) -> int | None:
        """Load the newest checkpoint at most `keep` and cut the attention KV after it: the tokens now kept,
        or None (none fits, or llama.cpp refused: the caller clears the sequence)."""
        checkpoint = choose(self.store.of(seq_id), keep)
        if checkpoint is None:
            return None
        if not self._model.seq_partial_restore(seq_id, checkpoint.state):
            log.warning("slot %d: restoring the checkpoint at %d failed", seq_id, checkpoint.pos)
            return None
        if not self._model.seq_remove(seq_id, checkpoint.pos):
            log.warning("slot %d: no cut after the checkpoint at %d", seq_id, checkpoint.pos)
            return None
        self.store.restored += 1
        self.store.restored_tokens += checkpoint.pos
        log.info("slot %d: restored the checkpoint at %d (%d wanted)", seq_id, checkpoint.pos, keep)
        return checkpoint.pos


def uncut(model: Model, checkpointer: Checkpointer | None, seq_id: int, keep: int) -> int:
    """llama.cpp cannot cut `seq_id` at `keep` (a recurrent state): restore a checkpoint at most `keep` or,
    without one (always for a dense model, whose cuts do not fail), clear the sequence; what it still holds."""
    restored = None if checkpointer is None else checkpointer.restore(seq_id, keep)
    if restored is None:
        model.seq_clear(seq_id)
        return 0
    return restored
