"""Which free KV slot a new prompt takes (issue 22): the one that keeps the most cached work, so a chat
frontend's background task never overwrites the slot holding a conversation's long tools prefix."""

from __future__ import annotations

from backends.llamacpp.worker.slots import Slot, pick_slot, take_slot

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


def test_where_every_choice_loses_work_a_stale_context_goes_before_the_one_just_used() -> None:
    """Two slots: an agent session that ended long ago (its state too large for the host cache, so precious
    for good) and the chat just answered. The chat's title task must not overwrite the chat."""
    stale = Slot(0, cached=list(range(20_000, 29_300)), used=3)
    live = Slot(1, cached=list(TOOLS_PREFIX), used=26)
    assert pick_slot([stale, live], TITLE) is stale


def test_a_frontend_task_right_after_its_chat_overwrites_the_previous_task_not_the_chat() -> None:
    chat, task = Slot(0, cached=list(TOOLS_PREFIX), used=40), Slot(1, cached=list(range(50, 400)), used=41)
    assert pick_slot([chat, task], list(range(9000, 9300))) is task


def test_taking_a_slot_marks_it_the_most_recently_used() -> None:
    slots = [Slot(0, used=5), Slot(1, busy=True, used=9), Slot(2, cached=list(range(100)), used=2)]
    taken = take_slot(slots, [1, 2, 3])
    assert taken is slots[0] and taken.used == 10
