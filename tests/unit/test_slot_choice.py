"""Which free KV slot a new prompt takes (issue 22): the one that keeps the most cached work, so a chat
frontend's background task never overwrites the slot holding a conversation's long tools prefix."""

from __future__ import annotations

from backends.llamacpp.worker.slots import Slot, pick_slot

TOOLS_PREFIX = list(range(1000, 8000))  # a 7k-token system prompt with tool definitions
TITLE = [1000, 1001, 1002, *range(50, 400)]  # shares the template's first tokens only


def test_a_prompt_that_shares_nothing_useful_takes_the_empty_slot_not_the_hot_one() -> None:
    hot, empty = Slot(0, cached=list(TOOLS_PREFIX)), Slot(1)
    assert pick_slot([hot, empty], TITLE) is empty


def test_a_short_shared_prefix_does_not_win_over_keeping_a_long_one() -> None:
    hot, other = Slot(0, cached=list(TOOLS_PREFIX)), Slot(1, cached=list(range(50, 90)))
    title = [*TOOLS_PREFIX[:20], *range(50, 400)]  # 20 shared tokens would overwrite 6,980 cached
    assert pick_slot([hot, other], title) is other


def test_the_next_message_of_the_conversation_takes_its_hot_slot() -> None:
    background, hot = Slot(0, cached=list(TITLE)), Slot(1, cached=list(TOOLS_PREFIX))
    assert pick_slot([background, hot], [*TOOLS_PREFIX, 5, 6, 7]) is hot


def test_with_every_slot_holding_something_the_least_cached_is_overwritten() -> None:
    big, small = Slot(0, cached=list(TOOLS_PREFIX)), Slot(1, cached=list(range(50, 300)))
    assert pick_slot([big, small, Slot(2, busy=True)], list(range(9000, 9100))) is small


def test_ties_go_to_the_lowest_free_slot() -> None:
    assert pick_slot([Slot(0, busy=True), Slot(1), Slot(2)], [1, 2, 3]).seq_id == 1
