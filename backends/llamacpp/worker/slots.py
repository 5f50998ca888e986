"""Engine-thread state of the scheduler: KV slots, the sequences running in them, a step's batch runs.

Nothing here is thread-safe: only the engine thread (see `scheduler`) creates or touches these objects.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from backends.llamacpp.worker.logprobs import LogprobQueue
from backends.llamacpp.worker.text import StopMatcher, Utf8Stream
from backends.llamacpp.worker.tickets import TextDelta, Ticket, TokenLogprob, Usage

if TYPE_CHECKING:  # the slot logic runs without llama.cpp loaded (its unit tests stay native-free)
    from backends.llamacpp.worker.native import Model
    from backends.llamacpp.worker.sampler import Sampler

# A cached prefix shorter than this does not outweigh keeping busy slots contiguous (a BOS token or a
# chat template's first few tokens are shared by nearly every prompt).
MIN_REUSE_TOKENS = 16


@dataclass(frozen=True)
class Origin:
    """What the request that last ran in a slot says about the worth of the KV it left there."""

    prompt_tokens: int
    reused_tokens: int  # prompt tokens it found cached (in the slot or restored from host memory)
    session_key: str | None = None  # the client's session, when it named one


@dataclass
class Slot:
    """One llama.cpp sequence (one KV stream unless KV is unified) and the tokens whose KV it holds."""

    seq_id: int
    cached: list[int] = field(default_factory=list)  # by position
    busy: bool = False
    origin: Origin | None = None  # set when a request is admitted into it
    used: int = 0  # the worker's admission count when a request was last admitted into it (0: never)


class Emitted(NamedTuple):
    """What one token (or the end of generation) releases: text, the entries riding with it, and the stop
    string that ended the text (None when none did)."""

    text: str
    logprobs: tuple[TokenLogprob, ...]
    matched: str | None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def delta(self) -> TextDelta | None:
        return TextDelta(self.text, self.logprobs) if self.text or self.logprobs else None


class SeqState:
    """One running request.

    Group members (`Scheduler.submit_group`) admitted while their leader still prefills are parked:
    `leader` is set, they take no part in the batch, and when the leader's last prompt token is decoded
    they get its KV and sample from its logits row. A leader that leaves before that hands its
    `followers` to the first of them, which then prefills on its own.
    """

    def __init__(
        self, ticket: Ticket, slot: Slot, sampler: Sampler | None, model: Model, *, group: int, cached_tokens: int
    ) -> None:
        self.ticket = ticket
        self.request = ticket.request
        self.slot = slot
        self.sampler = sampler  # None: plain greedy, or built by the slow lane (`slow`)
        self.slow = False  # samples off the engine's step (`slow_lane`: a heavy grammar)
        self.banned = model.eog_ids if self.request.sampling.ignore_eos else frozenset()
        self.group = group
        self.cached_tokens = cached_tokens
        self.leader: SeqState | None = None
        self.followers: list[SeqState] = []
        self.started_s = time.monotonic()
        self.pending: int | None = None  # sampled, not yet decoded
        self.n_generated = 0
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(self.request.stop)
        self.logprobs = LogprobQueue() if self.request.logprobs is not None else None
        budget = self.request.thinking_budget
        self.budget = budget.tracker() if budget is not None else None
        self.forced: list[int] = []  # tokens to generate next instead of sampling (the thinking's closing)

    @property
    def prefill_left(self) -> int:
        return len(self.request.prompt) - len(self.slot.cached)

    def usage(self) -> Usage:
        """Its token counts so far: the whole prompt, the tokens generated, the prompt tokens it reused."""
        return Usage(len(self.request.prompt), self.n_generated, self.cached_tokens)

    @property
    def prefilling(self) -> bool:
        """Has prompt tokens to decode in the next step (parked followers have none of their own)."""
        return self.pending is None and self.leader is None and self.prefill_left > 0

    def leave_group(self) -> None:
        """A leaving parked follower leaves its leader; a leaving leader hands its followers to the first."""
        if self.leader is not None:
            self.leader.followers.remove(self)
            self.leader = None
        if self.followers:
            heir, *rest = self.followers
            heir.leader, heir.followers = None, rest
            for follower in rest:
                follower.leader = heir
            self.followers = []

    def push(self, piece: bytes, entry: TokenLogprob | None) -> Emitted:
        """A generated token's bytes (and its entry when logprobs were asked for)."""
        text = self.utf8.push(piece)
        if self.logprobs is not None and entry is not None:
            self.logprobs.add(entry, len(text))
        result = self.stops.push(text)
        if self.budget is None:
            return self._emitted(result.text, result.matched, final=False)
        self.forced += self.budget.after(result.text)  # a spent thinking budget: its closing tokens come next
        shown, hidden = self.budget.shown(result.text, final=result.stopped)
        return self._emitted(shown, result.matched, final=False, hidden=hidden)

    def flush(self) -> Emitted:
        """Generation ended on EOS or a limit: release the held-back text (it may still complete a stop)."""
        result = self.stops.push(self.utf8.flush())
        text = result.text if result.stopped else result.text + self.stops.flush()
        shown, hidden = self.budget.shown(text, final=True) if self.budget is not None else (text, 0)
        return self._emitted(shown, result.matched, final=True, hidden=hidden)

    def _emitted(self, text: str, matched: str | None, *, final: bool, hidden: int = 0) -> Emitted:
        """`hidden`: characters of the text not shown (a budget-cut model's own reasoning tags), released too."""
        if self.logprobs is None:
            return Emitted(text, (), matched)
        entries = self.logprobs.release(len(text) + hidden, stopped=matched is not None, final=final)
        return Emitted(text, entries, matched)


class Run(NamedTuple):
    """Consecutive tokens of one slot in a step's batch; `seq` None marks a gap filler."""

    slot: Slot
    seq: SeqState | None
    tokens: Sequence[int]
    logits: bool


def run_order(run: Run) -> int:
    return run.slot.seq_id


_BLOCK = 512


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    """The number of leading tokens `a` and `b` share. Blocks of `_BLOCK` are compared as tuples (in C), and
    only the block holding the first difference token by token: an agent's 30k-token prompt is compared
    with each slot and saved state at every admission, on the engine thread."""
    n = min(len(a), len(b))
    start = 0
    while start < n:
        end = min(start + _BLOCK, n)
        if tuple(a[start:end]) != tuple(b[start:end]):
            break
        start = end
    for i in range(start, min(start + _BLOCK, n)):
        if a[i] != b[i]:
            return i
    return n


def pick_slot(slots: Sequence[Slot], prompt: Sequence[int], precious: Callable[[Slot], bool] | None = None) -> Slot:
    """The free slot that keeps the most cached work: the one whose KV shares the longest prefix with
    `prompt` (if at least `MIN_REUSE_TOKENS` long), less what the new prompt overwrites there.

    A request that shares nothing useful (a chat frontend's title or tag task) goes to an empty slot, or
    the one with the least cached, never onto the slot that holds a long hot prefix (a 7k-token tools
    prompt) while another is free: as llama.cpp's server picks slots by prompt similarity, keeping the hot
    prefix for the conversation's next message. Ties go to the lowest id (busy slots stay contiguous).

    `precious(slot)` False says that losing the slot's cached tokens costs little (a state the host prompt
    cache already holds, or one not worth keeping: `prompt_cache.SavePolicy`). A prompt that shares nothing
    with such a slot counts it as good as empty: it is overwritten before any slot whose loss costs its
    tokens, the one with the least cached first. A slot the prompt shares a prefix with is weighed as
    always (reuse less loss), so a short state is not wiped for a few shared tokens while an empty slot is
    free. None: every slot's tokens are precious.

    Where every choice loses work, the loss is weighed by how recently the slot was used: divided by one
    plus the admissions since (`Slot.used`; llama.cpp's server takes the least recently used slot here). A
    session's context just used outweighs an older, larger one; without it a state too large for the host
    cache, whose session has ended, would hold its slot for good while each of a frontend's tasks overwrote
    the live conversation in the other (2 slots, KV f16: `bench/results/2026-12-06-gpu-sessions-h200-ab32d6e/`).
    """
    best: Slot | None = None
    best_key: tuple[float, int] = (0, 0)
    newest = max((slot.used for slot in slots), default=0)
    for slot in slots:  # ascending ids
        if slot.busy:
            continue
        reuse = common_prefix_len(slot.cached, prompt)
        if reuse < MIN_REUSE_TOKENS:
            reuse = 0
        lost = len(slot.cached) - reuse  # cached tokens the new prompt overwrites
        cheap = reuse == 0 and precious is not None and not precious(slot)
        net = reuse - lost
        key = (0, -lost) if cheap else (net if net >= 0 else net / (1 + newest - slot.used), 0)
        if best is None or key > best_key:
            best, best_key = slot, key
    assert best is not None, "admitted without a free slot"
    return best


def take_slot(slots: Sequence[Slot], prompt: Sequence[int], precious: Callable[[Slot], bool] | None = None) -> Slot:
    """`pick_slot`'s choice, marked as the most recently used (`Slot.used`)."""
    slot = pick_slot(slots, prompt, precious)
    slot.used = max(other.used for other in slots) + 1
    return slot


def fillers(slots: Sequence[Slot], runs: Sequence[Run], room: int, n_ctx: int, token: int) -> list[Run]:
    """Up to `room` one-token filler runs, one for each idle slot between two slots that take part."""
    present = {run.slot.seq_id for run in runs}
    found: list[Run] = []
    for seq_id in range(min(present), max(present)):
        slot = slots[seq_id]
        if seq_id in present or len(slot.cached) >= n_ctx:
            continue
        if len(found) == room:
            break
        found.append(Run(slot, None, (token,), False))
    return found
