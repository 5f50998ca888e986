"""Hot prefixes kept in host memory when their slot must be reused (llama.cpp server's `--cache-ram`).

A free slot keeps its sequence's KV for prefix reuse (`slots.pick_slot`), but with few slots a request
that shares nothing with any of them (a chat frontend's title or tag task) must overwrite one, and the
7k-token tools prefix of the conversation's next message is lost. So a slot's KV state worth keeping is
copied to host memory (`llama_state_seq_get_data`), keyed by the exact tokens it holds; when a new prompt
shares a longer prefix with a saved state than with the slot it was given, the state is copied back into
that slot (`llama_state_seq_set_data`) and only the tokens after the shared prefix are prefilled.

What it costs, and so when it copies (issue 34): the copy runs on the engine thread, and every stream on
the worker waits for it. On an H200 a 7B's ~420-token state (117 MiB of q8_0 KV) took ~125 ms, more than
prefilling those tokens again, and saving every overwritten slot cost 20-35 % of throughput on unique
prompts that never came back. So:
* only a state worth keeping is saved (`SavePolicy`): a long prompt (an agent's or a tools prefix), a
  prefix that was already reused (a conversation's later turn), or a session the client named;
* it is saved while the engine is idle (`save_idle`: between an agent's turns, while the client runs its
  tools), once the engine has idled `SavePolicy.idle_after_s` (a turn that comes back sooner finds its slot
  as it left it and waits for no copy: on an H100 a 7B's 7,201-token state took 1,045 ms, and Claude Code's
  next turn waited behind it), one slot at a time, so a request that arrives waits for one copy at most,
  and only into free room; a state still unsaved when its slot is needed is copied on the admission's path;
* the slot choice overwrites a state that is saved already or not worth keeping first (`precious`).
llama.cpp copies a sequence's state in one call (no chunks to spread between decode steps), so idle time
and a stricter policy are what take the copy off the request path.

The key is the slot's token list, image placeholders included (`vision.cache_tokens`: one negative id per
image, from its digest), so a state is only ever reused up to the first token or image that differs; the
scheduler then cuts it as it cuts a slot's own KV (`GenerationRequest.reusable`, never inside an image).
The saved states are bounded by `limit_bytes` (least recently used first out); 0 turns the cache off.

A recurrent or hybrid model's state cannot be cut back (`checkpoints`): an entry carries the slot's context
checkpoints (their bytes count against the bound), which come back with it, so a cut inside it restores one
of them, or clears the slot (a full prefill, never a wrong state). Such an entry is only loaded when what it
keeps after that cut beats what the slot keeps (`checkpoints.reachable`). A dense model's entries carry none.

Engine thread only, like `slots`.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.base import PROMPT_CACHE_MIB
from backends.llamacpp.worker.checkpoints import Checkpoint, CheckpointStore, reachable
from backends.llamacpp.worker.slots import MIN_REUSE_TOKENS, Slot, common_prefix_len

if TYPE_CHECKING:  # the cache logic runs without llama.cpp loaded (its unit tests stay native-free)
    from backends.llamacpp.worker.native import Model

log = logging.getLogger("voltgate.worker")

# A slot whose new prompt overwrites fewer cached tokens than this is not saved: a chat's next message
# keeps nearly all of its slot, and tiny states are not worth the copy.
MIN_SAVE_TOKENS = 64

# `SavePolicy.long_prompt_tokens` by where the KV lives. On a CPU a copy is a memcpy, a small fraction of
# prefilling the same tokens again, so any state is worth it. On a GPU the copy crosses PCIe through
# llama.cpp's state API (~1 GB/s measured on an H200, issue 34) and costs about as much as the prefill of a
# short prompt it saves, so only prompts long enough to be a tools prefix or an agent's context are saved
# without other evidence that they come back.
LONG_PROMPT_TOKENS_CPU = MIN_SAVE_TOKENS
LONG_PROMPT_TOKENS_GPU = 1024

# `SavePolicy.idle_after_s`: an agent's tool call (a file read, a grep) usually returns within it, and the turn
# it sends back needs no copy; a person typing a reply, or a tool run longer than it, leaves the copy idle time.
IDLE_SAVE_AFTER_S = 2.0

DEFAULT_PROMPT_CACHE_MIB = PROMPT_CACHE_MIB  # the plan's default too (`backends.base`): one number

# Each admission compares its prompt with every saved state (in Python): many small states (a frontend's
# title tasks) must not make that slow.
MAX_ENTRIES = 64


@dataclass(frozen=True)
class SavedPrompt:
    tokens: tuple[int, ...]
    state: bytearray  # llama_state_seq_get_data's bytes of the sequence that held exactly `tokens`
    checkpoints: tuple[Checkpoint, ...] = ()  # a recurrent model's (`checkpoints`), at most len(tokens)

    @property
    def size(self) -> int:
        return len(self.state) + sum(len(c.state) for c in self.checkpoints)


@dataclass(frozen=True)
class PromptCacheStats:
    entries: int
    bytes: int
    limit_bytes: int
    saved_total: int
    restored_total: int
    restored_tokens_total: int
    saved_idle_total: int  # of saved_total, copied while the engine had nothing else to do
    save_seconds_total: float  # engine time spent copying states to host memory
    save_seconds_in_path: float  # of which while requests were waiting or running


@dataclass(frozen=True)
class SavePolicy:
    """Which slot states are worth a copy to host memory: at least `MIN_SAVE_TOKENS` would be lost and
    either the prompt that built it was at least `long_prompt_tokens` long, or it reused at least
    `MIN_SAVE_TOKENS` cached tokens itself (a prefix that came back once tends to come back), or its client
    named a session (`GenerationRequest.session_key`). Saved while idle only after the engine has idled
    `idle_after_s`."""

    long_prompt_tokens: int = LONG_PROMPT_TOKENS_CPU
    idle_after_s: float = IDLE_SAVE_AFTER_S

    def worth_saving(self, slot: Slot) -> bool:
        origin = slot.origin
        if origin is None or len(slot.cached) < MIN_SAVE_TOKENS:
            return False
        return (
            origin.prompt_tokens >= self.long_prompt_tokens
            or origin.reused_tokens >= MIN_SAVE_TOKENS
            or origin.session_key is not None
        )


class PromptCache:
    """Saved sequence states by their tokens, at most `limit_bytes` and `max_entries` of them, least recently
    used out first."""

    def __init__(self, limit_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
        self.limit_bytes = max(0, limit_bytes)
        self._max_entries = max(1, max_entries)
        self._entries: OrderedDict[tuple[int, ...], SavedPrompt] = OrderedDict()  # oldest first
        self._bytes = 0
        self._saved = 0
        self._saved_idle = 0
        self._restored = 0
        self._restored_tokens = 0
        self._save_s = 0.0
        self._save_in_path_s = 0.0

    @property
    def enabled(self) -> bool:
        return self.limit_bytes > 0

    def best(self, prompt: Sequence[int]) -> tuple[SavedPrompt, int] | None:
        """The saved state sharing the longest prefix with `prompt` and that length (0 shared: None)."""
        found: tuple[SavedPrompt, int] | None = None
        for entry in self._entries.values():
            shared = common_prefix_len(entry.tokens, prompt)
            if shared > 0 and (found is None or shared > found[1]):
                found = (entry, shared)
        return found

    def covers(self, tokens: Sequence[int]) -> bool:
        """Some saved state already holds all of `tokens` (a longer or equal sequence starting with them)."""
        n = len(tokens)
        key = tuple(tokens)
        return any(len(k) >= n and k[:n] == key for k in self._entries)

    def fits_without_evicting(self, tokens: Sequence[int], size: int) -> bool:
        """A state of `size` bytes holding `tokens` fits beside every entry it does not cover."""
        covered = self._covered_by(tuple(tokens))
        freed = sum(self._entries[k].size for k in covered)
        return (
            self.enabled
            and self._bytes - freed + size <= self.limit_bytes
            and len(self._entries) - len(covered) < self._max_entries
        )

    def put(self, tokens: Sequence[int], state: bytearray, checkpoints: Sequence[Checkpoint] = ()) -> bool:
        """Keep `state` (the KV of exactly `tokens`, with the slot's `checkpoints`); entries it covers go, then
        the oldest until it fits."""
        entry = SavedPrompt(tuple(tokens), state, tuple(checkpoints))
        size = entry.size
        if not self.enabled or size > self.limit_bytes or not tokens:
            return False
        key = entry.tokens
        for other in self._covered_by(key):
            self._drop(other)
        while self._entries and (self._bytes + size > self.limit_bytes or len(self._entries) >= self._max_entries):
            self._drop(next(iter(self._entries)))
        self._entries[key] = entry
        self._bytes += size
        self._saved += 1
        return True

    def _covered_by(self, key: tuple[int, ...]) -> list[tuple[int, ...]]:
        return [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]

    def record_save(self, seconds: float, *, idle: bool) -> None:
        """A copy to host memory took `seconds` of engine time, `idle` or on a request's path."""
        self._save_s += seconds
        if idle:
            self._saved_idle += 1
        else:
            self._save_in_path_s += seconds

    def touch(self, entry: SavedPrompt, restored_tokens: int) -> None:
        """`entry` was just restored: it becomes the most recently used (if saving the slot it was loaded
        into has not just pushed it out)."""
        if entry.tokens in self._entries:
            self._entries.move_to_end(entry.tokens)
        self._restored += 1
        self._restored_tokens += restored_tokens

    def drop(self, entry: SavedPrompt) -> None:
        if entry.tokens in self._entries:
            self._drop(entry.tokens)

    def stats(self) -> PromptCacheStats:
        return PromptCacheStats(
            len(self._entries),
            self._bytes,
            self.limit_bytes,
            self._saved,
            self._restored,
            self._restored_tokens,
            self._saved_idle,
            round(self._save_s, 6),
            round(self._save_in_path_s, 6),
        )

    def _drop(self, key: tuple[int, ...]) -> None:
        self._bytes -= self._entries.pop(key).size


class HostPrompts:
    """The scheduler's hooks: save a slot worth keeping while idle or before a prompt overwrites it, restore a
    better saved prefix, and tell the slot choice which states are cheap to lose."""

    def __init__(
        self,
        model: Model,
        cache: PromptCache,
        policy: SavePolicy | None = None,
        checkpoints: CheckpointStore | None = None,
    ) -> None:
        self._model = model
        self.cache = cache
        self.policy = policy or SavePolicy()
        self.checkpoints = checkpoints or CheckpointStore(0)
        self._too_big: dict[int, int] = {}  # slot id -> its cached length when its state did not fit

    def precious(self, slot: Slot) -> bool:
        """Losing this slot's state costs its tokens: it is worth keeping and not saved yet (`pick_slot`).
        With the cache off every state is precious, as without this hook."""
        return not self.cache.enabled or self._worth_and_uncovered(slot)

    def save_idle(self, slots: Sequence[Slot]) -> bool:
        """Save one free slot worth keeping that no saved state covers yet (engine idle); False: none left.

        Only into free room: the slot still holds its state, while the entries an eviction would drop are
        held nowhere else, so an early copy must not push one out (the admission that overwrites the slot
        may, as it always could)."""
        if not self.cache.enabled:
            return False
        return any(not slot.busy and self._unsaved(slot) and self._save(slot, idle=True) for slot in slots)

    def idle_save_due(self, slots: Sequence[Slot], now: float) -> float | None:
        """When (monotonic seconds) an engine idle since `now` should start `save_idle`; None: nothing to save."""
        if not self.cache.enabled or not any(not slot.busy and self._unsaved(slot) for slot in slots):
            return None
        return now + self.policy.idle_after_s

    def prepare(self, slot: Slot, prompt: Sequence[int]) -> None:
        """Called with the free slot `prompt` was given, before its KV is cut to the shared prefix.

        Saves what the slot holds if it is worth keeping, the prompt overwrites at least `MIN_SAVE_TOKENS`
        of it and no saved state covers it (usually `save_idle` did so already); then, if a saved state
        shares a longer prefix with `prompt` (at least `MIN_REUSE_TOKENS`), loads it into the slot, so that
        `slot.cached` is exactly that state's tokens.
        """
        if not self.cache.enabled:
            return
        kept = common_prefix_len(slot.cached, prompt)
        found = self.cache.best(prompt)
        if len(slot.cached) - kept >= MIN_SAVE_TOKENS and self._unsaved(slot):
            self._save(slot, idle=False)
        if found is None:
            return
        entry, shared = found
        if shared <= kept or shared < MIN_REUSE_TOKENS:
            return
        if self.checkpoints.recurrent and not self._gains(slot, entry, prompt, kept, shared):
            return
        self._restore(slot, entry, shared)

    def _gains(self, slot: Slot, entry: SavedPrompt, prompt: Sequence[int], kept: int, shared: int) -> bool:
        """A recurrent model: the entry keeps more than the slot once each is cut for `prompt` (the scheduler
        keeps at most all but the last prompt token) back to a checkpoint, or to nothing."""
        last = len(prompt) - 1
        mine = reachable(len(slot.cached), self.checkpoints.of(slot.seq_id), min(kept, last))
        return reachable(len(entry.tokens), entry.checkpoints, min(shared, last)) > mine

    def _unsaved(self, slot: Slot) -> bool:
        """Worth a copy that has not been made, and not one already found too big for the cache."""
        return self._too_big.get(slot.seq_id) != len(slot.cached) and self._worth_and_uncovered(slot)

    def _worth_and_uncovered(self, slot: Slot) -> bool:
        return self.policy.worth_saving(slot) and not self.cache.covers(slot.cached)

    def _restore(self, slot: Slot, entry: SavedPrompt, shared: int) -> None:
        self._model.seq_clear(slot.seq_id)
        slot.cached.clear()
        self.checkpoints.replace(slot.seq_id, entry.checkpoints)
        if not self._model.seq_state_restore(slot.seq_id, entry.state):
            log.warning("restoring a saved prompt of %d tokens into slot %d failed", len(entry.tokens), slot.seq_id)
            self._model.seq_clear(slot.seq_id)
            self.checkpoints.clear(slot.seq_id)
            self.cache.drop(entry)
            return
        slot.cached.extend(entry.tokens)
        self.cache.touch(entry, shared)
        log.info(
            "slot %d: restored %d saved tokens (%d shared with the prompt)", slot.seq_id, len(entry.tokens), shared
        )

    def _save(self, slot: Slot, *, idle: bool) -> bool:
        started = time.perf_counter()
        checkpoints = self.checkpoints.of(slot.seq_id)  # a recurrent model's: they go with the state
        size = self._model.seq_state_size(slot.seq_id)
        if size <= 0 or size > self.cache.limit_bytes:
            self._too_big[slot.seq_id] = len(slot.cached)
            return False
        if idle and not self.cache.fits_without_evicting(slot.cached, size + sum(len(c.state) for c in checkpoints)):
            return False
        state = self._model.seq_state_save(slot.seq_id, size)
        if state is None or not self.cache.put(slot.cached, state, checkpoints):
            return False
        seconds = time.perf_counter() - started
        self.cache.record_save(seconds, idle=idle)
        stats = self.cache.stats()
        log.info(
            "slot %d: saved %d tokens to host memory in %.1f ms%s (%.1f MiB; cache %d entries, %.1f of %.0f MiB)",
            slot.seq_id,
            len(slot.cached),
            seconds * 1000,
            " while idle" if idle else "",
            size / 2**20,
            stats.entries,
            stats.bytes / 2**20,
            stats.limit_bytes / 2**20,
        )
        return True
