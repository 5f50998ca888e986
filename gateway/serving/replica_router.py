"""Which replica of a model a request goes to: least outstanding work, with affinity for the replica that
holds the request's session or its long prefix (issue 38 item 3), as SGLang's cache-aware router and Dynamo's
approximate KV routing do.

Pure and synchronous: the caller passes each replica's load as it is now (`ReplicaLoad`: requests admitted and
not finished, and whether it takes requests) and the request's prompt text and session key; `ReplicaRouter.pick`
answers the replica and why (`Pick.reason`), and remembers what it routed:

* **session**: a session key (`gateway.serving.prompt_prefix.session_key`: Claude Code's `metadata.user_id`,
  Codex's session header, Responses' `prompt_cache_key`/`previous_response_id`, OpenAI `user`) goes back to the
  replica that served its last turn, where the engine's slot or prefix cache holds it;
* **prefix**: otherwise the replica that was sent the longest run of the prompt's leading text blocks (an
  approximate index: chained hashes of `block_chars`-character blocks per replica, least recently used out past
  `capacity_blocks`, never the engines' own caches, which are not asked), if that run is at least
  `min_prefix_blocks` long;
* **load**: otherwise, and whenever the affine replica is overloaded (more than `balance_abs` requests above the
  least loaded one, and more than `balance_rel` times it), the least loaded replica (ties: the first).

A replica that does not take requests is never picked; `forget` drops what is known of one that left.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

BLOCK_CHARS = 512
"""Characters per prefix block: ~128 tokens, so a 5-30k-token agent prefix is 40-240 blocks."""


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica as the router sees it now."""

    name: str
    outstanding: int  # requests admitted to it and not finished (queued in its admission, or at its worker)
    healthy: bool = True  # takes requests now (READY)


@dataclass(frozen=True)
class Pick:
    replica: str
    reason: Literal["session", "prefix", "load"]
    prefix_blocks: int = 0  # leading blocks of the prompt the picked replica was sent before


class NoReplica(Exception):
    """No replica of the model takes requests now."""


def prompt_blocks(text: str, block_chars: int = BLOCK_CHARS) -> list[bytes]:
    """The prompt's whole leading blocks as chained digests: block i's digest covers blocks 0..i, so a replica
    that holds it was sent this exact prefix."""
    digests, previous = [], b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        previous = hashlib.blake2b(previous + text[start : start + block_chars].encode(), digest_size=8).digest()
        digests.append(previous)
    return digests


@dataclass
class PrefixIndex:
    """Per replica, the prefix blocks it was sent, least recently used out past `capacity_blocks`."""

    capacity_blocks: int = 65_536
    _blocks: dict[str, OrderedDict[bytes, None]] = field(default_factory=dict)

    def match(self, replica: str, blocks: Sequence[bytes]) -> int:
        """How many of `blocks`, from the first, `replica` was sent (a binary search: blocks are chained)."""
        held = self._blocks.get(replica)
        if not held:
            return 0
        low, high = 0, len(blocks)
        while low < high:
            middle = (low + high + 1) // 2
            if blocks[middle - 1] in held:
                low = middle
            else:
                high = middle - 1
        return low

    def add(self, replica: str, blocks: Sequence[bytes]) -> None:
        """Remember `blocks` as sent to `replica`. The first block is made the most recent, so eviction takes a
        prompt's deepest blocks first and a held block's whole prefix stays held (what `match` relies on)."""
        held = self._blocks.setdefault(replica, OrderedDict())
        for block in reversed(blocks):
            held[block] = None
            held.move_to_end(block)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)

    def forget(self, replica: str) -> None:
        self._blocks.pop(replica, None)


@dataclass
class ReplicaRouter:
    """See the module docstring. One per model; not thread-safe (the gateway's event loop calls it)."""

    balance_abs: int = 4
    balance_rel: float = 1.5
    min_prefix_blocks: int = 2
    block_chars: int = BLOCK_CHARS
    sessions_kept: int = 4096
    index: PrefixIndex = field(default_factory=PrefixIndex)
    _sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)

    def pick(self, loads: Sequence[ReplicaLoad], prompt: str, session: str | None = None) -> Pick:
        """The replica for a request (raises `NoReplica` when none takes requests), remembered for the next."""
        healthy = {load.name: load for load in loads if load.healthy}
        if not healthy:
            raise NoReplica("no replica of the model takes requests now")
        least = min(healthy.values(), key=lambda load: load.outstanding)
        blocks = prompt_blocks(prompt, self.block_chars)
        chosen = self._affine(healthy, least, blocks, session) or Pick(least.name, "load")
        self._remember(chosen.replica, blocks, session)
        return chosen

    def forget(self, replica: str) -> None:
        """A replica that left: its prefixes and the sessions on it are forgotten."""
        self.index.forget(replica)
        for session in [s for s, r in self._sessions.items() if r == replica]:
            del self._sessions[session]

    def _affine(
        self, healthy: dict[str, ReplicaLoad], least: ReplicaLoad, blocks: list[bytes], session: str | None
    ) -> Pick | None:
        """The session's replica, else the one holding the longest prefix, unless it is overloaded."""
        owner = self._sessions.get(session) if session is not None else None
        if owner in healthy and not self._overloaded(healthy[owner], least):
            return Pick(owner, "session", self.index.match(owner, blocks))
        matches = {name: self.index.match(name, blocks) for name in healthy}
        best = max(healthy, key=lambda name: matches[name])  # the first of equals: a stable choice
        if matches[best] >= self.min_prefix_blocks and not self._overloaded(healthy[best], least):
            return Pick(best, "prefix", matches[best])
        return None

    def _overloaded(self, load: ReplicaLoad, least: ReplicaLoad) -> bool:
        excess = load.outstanding - least.outstanding
        return excess > self.balance_abs and load.outstanding > self.balance_rel * least.outstanding

    def _remember(self, replica: str, blocks: list[bytes], session: str | None) -> None:
        self.index.add(replica, blocks)
        if session is not None:
            self._sessions[session] = replica
            self._sessions.move_to_end(session)
            while len(self._sessions) > self.sessions_kept:
                self._sessions.popitem(last=False)
