"""The host prompt cache's policy on hand-fed slot states (issue 34): which slot is saved, when (while idle or
on an admission's path), and which slot a prompt that shares nothing overwrites. A stand-in for llama.cpp's
sequence-state calls (1 byte per token); the real worker is in tests/integration/test_prompt_cache_worker.py."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic import ValidationError

from backends.llamacpp.worker.prompt_cache import (
    LONG_PROMPT_TOKENS_GPU,
    MIN_SAVE_TOKENS,
    HostPrompts,
    PromptCache,
    SavePolicy,
)
from backends.llamacpp.worker.slots import Origin, Slot, common_prefix_len, pick_slot
from tests.unit.llamacpp_argv import flag_value, llamacpp_argv

GPU = SavePolicy(LONG_PROMPT_TOKENS_GPU)
UNIQUE = list(range(10_000, 10_400))  # a benchmark's unique 400-token prompt (and its answer)
AGENT = list(range(20_000, 26_000))  # an agent's 6k-token context


class FakeModel:
    """Sequence states as the token lists they hold, 1 byte per token."""

    def __init__(self) -> None:
        self.seqs: dict[int, list[int]] = {}
        self.saves = 0
        self.sizes = 0

    def seq_clear(self, seq_id: int) -> None:
        self.seqs[seq_id] = []

    def seq_state_size(self, seq_id: int) -> int:
        self.sizes += 1
        return len(self.seqs.get(seq_id, []))

    def seq_state_save(self, seq_id: int, size: int) -> bytearray | None:
        self.saves += 1
        return bytearray(t % 256 for t in self.seqs[seq_id][:size])

    def seq_state_restore(self, seq_id: int, state: bytearray) -> bool:
        self.seqs[seq_id] = list(state)
        return True


def host(policy: SavePolicy, limit: int = 100_000) -> tuple[HostPrompts, FakeModel]:
    model = FakeModel()
    return HostPrompts(cast(Any, model), PromptCache(limit), policy), model


def holding(model: FakeModel, seq_id: int, tokens: list[int], origin: Origin | None) -> Slot:
    model.seqs[seq_id] = list(tokens)
    return Slot(seq_id, cached=list(tokens), origin=origin)


def test_a_short_unique_prompt_is_not_worth_a_copy_on_a_gpu() -> None:
    prompts, model = host(GPU)
    slot = holding(model, 0, UNIQUE, Origin(prompt_tokens=300, reused_tokens=0))
    prompts.prepare(slot, list(range(30_000, 30_300)))  # the next unique prompt overwrites it
    assert model.saves == 0 and prompts.cache.stats().entries == 0
    assert not prompts.save_idle([slot])


def test_a_long_prompt_a_reused_prefix_or_a_named_session_is_worth_it() -> None:
    assert GPU.worth_saving(Slot(0, cached=AGENT, origin=Origin(len(AGENT), 0)))
    assert GPU.worth_saving(Slot(0, cached=UNIQUE, origin=Origin(300, reused_tokens=MIN_SAVE_TOKENS)))
    assert GPU.worth_saving(Slot(0, cached=UNIQUE, origin=Origin(300, 0, session_key="s1")))
    assert not GPU.worth_saving(Slot(0, cached=UNIQUE, origin=Origin(300, reused_tokens=MIN_SAVE_TOKENS - 1)))
    assert not GPU.worth_saving(Slot(0, cached=UNIQUE[: MIN_SAVE_TOKENS - 1], origin=Origin(10, 0, "s1")))
    assert not GPU.worth_saving(Slot(0, cached=UNIQUE, origin=None))  # never admitted (nothing known)


def test_on_the_cpu_any_state_of_min_save_tokens_is_worth_it() -> None:
    cpu = SavePolicy()
    assert cpu.worth_saving(Slot(0, cached=UNIQUE, origin=Origin(len(UNIQUE), 0)))


def test_idle_saves_one_slot_at_a_time_and_only_the_unsaved() -> None:
    prompts, model = host(GPU)
    slots = [
        holding(model, 0, AGENT, Origin(len(AGENT), 0)),
        holding(model, 1, UNIQUE, Origin(300, 0)),  # not worth it
        holding(model, 2, list(range(40_000, 41_500)), Origin(1500, 0)),
    ]
    slots[0].busy = True  # still running: not saved while its sequence changes
    assert prompts.save_idle(slots) and model.saves == 1  # slot 2 only
    assert not prompts.save_idle(slots) and model.saves == 1  # nothing left to save
    slots[0].busy = False
    assert prompts.save_idle(slots) and model.saves == 2
    assert not prompts.save_idle(slots)
    stats = prompts.cache.stats()
    assert stats.saved_total == stats.saved_idle_total == 2 and stats.save_seconds_in_path == 0


def test_a_state_saved_while_idle_is_not_copied_again_when_its_slot_is_overwritten() -> None:
    prompts, model = host(GPU)
    slot = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    assert prompts.save_idle([slot])
    prompts.prepare(slot, UNIQUE)  # a title task takes the slot
    assert model.saves == 1
    slot.cached[:] = UNIQUE
    model.seqs[0] = list(UNIQUE)
    prompts.prepare(slot, [*AGENT, 1, 2, 3])  # the agent's next turn: its context comes back
    assert slot.cached == AGENT and prompts.cache.stats().restored_tokens_total == len(AGENT)


def test_an_unsaved_state_worth_keeping_is_saved_on_the_admissions_path() -> None:
    prompts, model = host(GPU)
    slot = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    prompts.prepare(slot, UNIQUE)
    stats = prompts.cache.stats()
    assert model.saves == 1 and stats.saved_total == 1 and stats.saved_idle_total == 0


def test_a_state_larger_than_the_cache_is_not_tried_again_and_again() -> None:
    prompts, model = host(GPU, limit=1000)
    slot = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    assert not prompts.save_idle([slot]) and not prompts.save_idle([slot])
    assert model.sizes == 1 and model.saves == 0
    assert prompts.precious(slot)  # it cannot be saved, so losing it costs its tokens


def test_a_prompt_sharing_nothing_overwrites_a_saved_or_worthless_state_first() -> None:
    prompts, model = host(GPU)
    agent = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    unique = holding(model, 1, UNIQUE, Origin(300, 0))
    title = list(range(50_000, 50_100))
    assert pick_slot([agent, unique], title, prompts.precious) is unique  # the unsaved agent context stays
    assert prompts.save_idle([agent, unique])
    small = holding(model, 1, UNIQUE[:100], Origin(len(AGENT), 0))  # precious too, and not saved
    assert pick_slot([agent, small], title, prompts.precious) is agent  # saved: its loss costs a restore only


def test_among_cheap_slots_the_one_with_the_least_cached_goes_first() -> None:
    prompts, model = host(GPU)
    big = holding(model, 0, UNIQUE, Origin(300, 0))
    small = holding(model, 1, UNIQUE[:100], Origin(80, 0))
    assert pick_slot([big, small], list(range(60_000, 60_050)), prompts.precious) is small


def test_a_shared_prefix_still_wins_over_a_cheap_slot() -> None:
    prompts, model = host(GPU)
    agent = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    empty = holding(model, 1, [], None)
    assert pick_slot([empty, agent], [*AGENT, 7], prompts.precious) is agent


def test_with_the_cache_off_every_state_is_precious_as_before() -> None:
    prompts, model = host(GPU, limit=0)
    slot = holding(model, 0, UNIQUE, Origin(300, 0))
    assert prompts.precious(slot) and not prompts.save_idle([slot])


def test_common_prefix_len_across_blocks_and_types() -> None:
    a = list(range(3000))
    assert common_prefix_len(a, tuple(a)) == 3000
    assert common_prefix_len(a, (*a[:1500], -1, *a[1501:])) == 1500
    assert common_prefix_len(a, a[:700]) == 700
    assert common_prefix_len([], a) == 0
    assert common_prefix_len(a, [*a[:511], -1]) == 511
    assert common_prefix_len(a, [*a[:512], -1]) == 512


def test_an_idle_save_never_evicts_a_state_that_is_held_nowhere_else() -> None:
    prompts, model = host(GPU, limit=len(AGENT) + 999)
    prompts.cache.put(list(range(70_000, 71_000)), bytearray(1000))  # an evicted session's state
    slot = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    assert not prompts.save_idle([slot]) and prompts.cache.stats().entries == 1
    prompts.prepare(slot, UNIQUE)  # the slot is really overwritten now: the copy may evict the older one
    assert prompts.cache.covers(AGENT)


def test_an_idle_save_replaces_the_shorter_state_of_the_same_session() -> None:
    prompts, model = host(GPU, limit=len(AGENT) + 10)
    prompts.cache.put(AGENT[:5000], bytearray(5000))  # the session's previous turn
    slot = holding(model, 0, AGENT, Origin(len(AGENT), 5000))
    assert prompts.save_idle([slot]) and prompts.cache.stats().entries == 1 and prompts.cache.covers(AGENT)


def test_a_short_state_is_not_wiped_for_a_few_shared_tokens_while_a_slot_is_empty() -> None:
    """tests/e2e/test_vision.py's case: a 54-token state shares 24 tokens with the next prompt (the text before
    a different image); the empty slot takes the prompt and the state stays for its own next request."""
    prompts, model = host(SavePolicy())
    red = holding(model, 0, [*range(24), *range(100, 130)], Origin(50, 0))
    empty = holding(model, 1, [], None)
    assert pick_slot([red, empty], [*range(24), *range(200, 226)], prompts.precious) is empty


def test_idle_saves_wait_for_the_policys_idle_time_and_only_when_there_is_something_to_save() -> None:
    prompts, model = host(SavePolicy(LONG_PROMPT_TOKENS_GPU, idle_after_s=2.0))
    agent = holding(model, 0, AGENT, Origin(len(AGENT), 0))
    unique = holding(model, 1, UNIQUE, Origin(300, 0))  # not worth a copy
    assert prompts.idle_save_due([agent, unique], now=100.0) == 102.0
    assert prompts.idle_save_due([unique], now=100.0) is None
    agent.busy = True
    assert prompts.idle_save_due([agent], now=100.0) is None  # a running slot is never saved while idle
    agent.busy = False
    assert prompts.save_idle([agent]) and prompts.idle_save_due([agent], now=100.0) is None  # saved already
    off, _ = host(GPU, limit=0)
    assert off.idle_save_due([agent], now=100.0) is None


def test_the_idle_time_reaches_the_worker_only_when_set() -> None:
    """`llamacpp.prompt_cache_idle_s` (issue 41): the worker's default (2 s) unless set; 0 (at once) allowed."""
    assert "--prompt-cache-idle-s" not in llamacpp_argv()
    assert flag_value(llamacpp_argv(prompt_cache_idle_s=0.5), "--prompt-cache-idle-s") == "0.5"
    assert flag_value(llamacpp_argv(prompt_cache_idle_s=0), "--prompt-cache-idle-s") == "0"
    with pytest.raises(ValidationError, match="prompt_cache_idle_s"):
        llamacpp_argv(prompt_cache_idle_s=-1)
