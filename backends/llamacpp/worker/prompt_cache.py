"""Hot prefixes kept in host memory when their slot must be reused (llama.cpp server's `--cache-ram`).

A free slot keeps its sequence's KV for prefix reuse (`slots.pick_slot`), but with few slots a request
that shares nothing with any of them (a chat frontend's title or tag task) must overwrite one, and the
7k-token tools prefix of the conversation's next message is lost. So before a slot's KV is overwritten
(at least `MIN_SAVE_TOKENS` of it), its sequence state is copied to host memory
(`llama_state_seq_get_data`), keyed by the exact tokens it holds; when a new prompt shares a longer prefix
with a saved state than with the slot it was given, the state is copied back into that slot
(`llama_state_seq_set_data`) and only the tokens after the shared prefix are prefilled.

The key is the slot's token list, image placeholders included (`vision.cache_tokens`: one negative id per
image, from its digest), so a state is only ever reused up to the first token or image that differs; the
scheduler then cuts it as it cuts a slot's own KV (`GenerationRequest.reusable`, never inside an image).
The saved states are bounded by `limit_bytes` (least recently used first out); 0 turns the cache off.

Engine thread only, like `slots`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends.llamacpp.worker.slots import MIN_REUSE_TOKENS, Slot, common_prefix_len

if TYPE_CHECKING:  # the cache logic runs without llama.cpp loaded (its unit tests stay native-free)
    from backends.llamacpp.worker.native import Model

log = logging.getLogger("voltgate.worker")

# A slot whose new prompt overwrites fewer cached tokens than this is not saved: a chat's next message
# keeps nearly all of its slot, and tiny states are not worth the copy.
MIN_SAVE_TOKENS = 64

DEFAULT_PROMPT_CACHE_MIB = 2048

# Each admission compares its prompt with every saved state (in Python): many small states (a frontend's
# title tasks) must not make that slow.
MAX_ENTRIES = 64


@dataclass(frozen=True)
class SavedPrompt:
    tokens: tuple[int, ...]
    state: bytearray  # llama_state_seq_get_data's bytes of the sequence that held exactly `tokens`


@dataclass(frozen=True)
class PromptCacheStats:
    entries: int
    bytes: int
    limit_bytes: int
    saved_total: int
    restored_total: int
    restored_tokens_total: int


class PromptCache:
    """Saved sequence states by their tokens, at most `limit_bytes` and `max_entries` of them, least recently
    used out first."""

    def __init__(self, limit_bytes: int, max_entries: int = MAX_ENTRIES) -> None:
        self.limit_bytes = max(0, limit_bytes)
        self._max_entries = max(1, max_entries)
        self._entries: OrderedDict[tuple[int, ...], SavedPrompt] = OrderedDict()  # oldest first
        self._bytes = 0
        self._saved = 0
        self._restored = 0
        self._restored_tokens = 0

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
        return any(len(e.tokens) >= n and common_prefix_len(e.tokens, tokens) == n for e in self._entries.values())

    def put(self, tokens: Sequence[int], state: bytearray) -> bool:
        """Keep `state` (the KV of exactly `tokens`); entries it covers go, then the oldest until it fits."""
        size = len(state)
        if not self.enabled or size > self.limit_bytes or not tokens:
            return False
        key = tuple(tokens)
        for other in [k for k in self._entries if len(k) <= len(key) and key[: len(k)] == k]:
            self._drop(other)
        while self._entries and (self._bytes + size > self.limit_bytes or len(self._entries) >= self._max_entries):
            self._drop(next(iter(self._entries)))
        self._entries[key] = SavedPrompt(key, state)
        self._bytes += size
        self._saved += 1
        return True

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
            len(self._entries), self._bytes, self.limit_bytes, self._saved, self._restored, self._restored_tokens
        )

    def _drop(self, key: tuple[int, ...]) -> None:
        self._bytes -= len(self._entries.pop(key).state)


class HostPrompts:
    """The scheduler's hook: save a slot before a prompt overwrites it, restore a better saved prefix."""

    def __init__(self, model: Model, cache: PromptCache) -> None:
        self._model = model
        self.cache = cache

    def prepare(self, slot: Slot, prompt: Sequence[int]) -> None:
        """Called with the free slot `prompt` was given, before its KV is cut to the shared prefix.

        Saves what the slot holds if the prompt overwrites at least `MIN_SAVE_TOKENS` of it (unless a saved
        state covers it already); then, if a saved state shares a longer prefix with `prompt` (at least
        `MIN_REUSE_TOKENS`), loads it into the slot, so that `slot.cached` is exactly that state's tokens.
        """
        if not self.cache.enabled:
            return
        kept = common_prefix_len(slot.cached, prompt)
        found = self.cache.best(prompt)
        if len(slot.cached) - kept >= MIN_SAVE_TOKENS and not self.cache.covers(slot.cached):
            self._save(slot)
        if found is None:
            return
        entry, shared = found
        if shared <= kept or shared < MIN_REUSE_TOKENS:
            return
        self._model.seq_clear(slot.seq_id)
        slot.cached.clear()
        if not self._model.seq_state_restore(slot.seq_id, entry.state):
            log.warning("restoring a saved prompt of %d tokens into slot %d failed", len(entry.tokens), slot.seq_id)
            self._model.seq_clear(slot.seq_id)
            self.cache.drop(entry)
            return
        slot.cached.extend(entry.tokens)
        self.cache.touch(entry, shared)
        log.info(
            "slot %d: restored %d saved tokens (%d shared with the prompt)", slot.seq_id, len(entry.tokens), shared
        )

    def _save(self, slot: Slot) -> None:
        size = self._model.seq_state_size(slot.seq_id)
        if size <= 0 or size > self.cache.limit_bytes:
            return
        state = self._model.seq_state_save(slot.seq_id, size)
        if state is None:
            return
        if self.cache.put(slot.cached, state):
            stats = self.cache.stats()
            log.info(
                "slot %d: saved %d tokens to host memory (%.1f MiB; cache %d entries, %.1f of %.0f MiB)",
                slot.seq_id,
                len(slot.cached),
                size / 2**20,
                stats.entries,
                stats.bytes / 2**20,
                stats.limit_bytes / 2**20,
            )
