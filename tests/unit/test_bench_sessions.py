"""The agent sessions of bench.session_replay (bench/sessions.py) and its summary: each turn's prompt is the
last one plus the answer and a tool result or user message; Claude Code's billing suffix changes per turn as the
real client's does; the goal counts only turns from the second on."""

from __future__ import annotations

import json

import pytest

from bench.session_replay import abba
from bench.session_results import CACHE_GOAL, SessionResult, TurnResult, goal_summary
from bench.sessions import SESSION_KINDS, AgentSession, background_tasks, one_turn_body


def _items(kind: str, body: dict) -> list:
    return body["input"] if kind == "codex" else body["messages"]


@pytest.mark.parametrize("kind", SESSION_KINDS)
def test_each_turn_extends_the_last_turns_items_with_the_answer(kind: str) -> None:
    session = AgentSession(kind, "m", max_tokens=16)  # type: ignore[arg-type]
    first = session.first_turn()
    second = session.next_turn("An answer from the model.")
    third = session.next_turn("")
    assert first.body["model"] == second.body["model"] == "m"
    a, b, c = (_items(kind, t.body) for t in (first, second, third))
    assert b[: len(a)] == a and c[: len(b)] == b and len(c) > len(b) > len(a)
    assert "An answer from the model." in json.dumps(b[len(a) :])
    assert second.new_text.startswith("An answer from the model.") and "(no text)" in third.new_text
    assert first.body is not second.body  # a turn's body never changes after it is returned


def test_claude_codes_billing_suffix_changes_per_turn_unless_held_still() -> None:
    volatile = AgentSession("claude", "m", max_tokens=16)
    texts = {volatile.first_turn().body["system"][0]["text"], volatile.next_turn("a").body["system"][0]["text"]}
    assert len(texts) == 2 and all(t.startswith("x-anthropic-billing-header: cc_version=2.1.197.") for t in texts)
    stable = AgentSession("claude", "m", max_tokens=16, volatile_billing=False)
    first, second = stable.first_turn(), stable.next_turn("a")
    assert first.body["system"][0] == second.body["system"][0]


def test_one_turn_prompts_carry_only_the_new_text_in_each_apis_shape() -> None:
    assert one_turn_body("messages", "m", "hi", 1)["messages"] == [{"role": "user", "content": "hi"}]
    assert one_turn_body("responses", "m", "hi", 1)["input"] == "hi"
    assert one_turn_body("chat", "m", "hi", 1)["stream_options"] == {"include_usage": True}


def test_open_webui_sends_title_and_tags_once_and_follow_ups_every_turn() -> None:
    history = [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]
    assert [n for n, _ in background_tasks(0, history)] == ["title", "tags", "follow_ups"]
    ((name, prompt),) = background_tasks(3, history)
    assert name == "follow_ups" and "USER: question\nASSISTANT: answer" in prompt and "{{MESSAGES" not in prompt


def test_abba_alternates_which_mode_goes_first() -> None:
    assert abba(2) == [(0, "on"), (0, "off"), (1, "off"), (1, "on")]


def test_the_goal_counts_turns_from_the_second_on() -> None:
    on = SessionResult("codex", "on", 0, 10.0, [
        TurnResult(0, 3000, 0, 60.0),
        TurnResult(1, 3200, 3000, 2.0, one_turn_ttft_s=1.0),  # 94 % cached, 2x the one-turn prompt
        TurnResult(2, 3400, 3200, 1.2, one_turn_ttft_s=1.0),  # 94 %, 1.2x
    ])  # fmt: skip
    off = SessionResult("codex", "off", 0, 120.0, [TurnResult(1, 3200, 4, 60.0)])
    assert on.turns[1].cached_share is not None and on.turns[1].cached_share >= CACHE_GOAL
    lines = goal_summary([on, off])
    assert "| codex | on | 2 of 2 | 1 of 2 |" in lines[2]
    assert "| codex | off | 0 of 1 | 0 of 1 |" in lines[3]


def test_cached_tokens_are_read_from_each_apis_own_usage() -> None:
    from bench.session_replay import Streamed, _usage

    chat = Streamed()
    _usage("chat", {"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 90}}}, chat)
    incomplete = Streamed()  # a Responses stream that reached max_output_tokens ends with response.incomplete
    _usage("responses", {"type": "response.incomplete", "response": {"usage": {
        "input_tokens": 100, "input_tokens_details": {"cached_tokens": 91}}}}, incomplete)  # fmt: skip
    messages = Streamed()  # Anthropic counts cache reads apart from input_tokens: the prompt is their sum
    _usage("messages", {"type": "message_delta", "usage": {"input_tokens": 8, "cache_read_input_tokens": 92,
                                                          "output_tokens": 3}}, messages)  # fmt: skip
    silent = Streamed()
    _usage("chat", {"usage": {"prompt_tokens": 100}}, silent)
    assert (chat.prompt_tokens, chat.cached_tokens) == (100, 90)
    assert (incomplete.prompt_tokens, incomplete.cached_tokens) == (100, 91)
    assert (messages.prompt_tokens, messages.cached_tokens) == (100, 92)
    assert (silent.prompt_tokens, silent.cached_tokens) == (100, None)  # not said: None, never 0


def test_the_same_count_baseline_is_counted_only_where_it_was_measured() -> None:
    turn = TurnResult(1, 9192, 9043, 0.041, one_turn_ttft_s=0.021, same_count_ttft_s=0.030)
    assert turn.new_tokens == 149
    assert turn.same_count_ratio == pytest.approx(0.041 / 0.030)
    tm = TurnResult(1, 9192, None, 0.041, one_turn_ttft_s=0.021)  # LMDeploy reports no cached tokens
    assert tm.new_tokens is None and tm.same_count_ratio is None
    lines = goal_summary([SessionResult("claude", "on", 0, 1.0, [TurnResult(0, 9000, 0, 1.0), turn]),
                          SessionResult("codex", "on", 0, 1.0, [TurnResult(0, 9000, 0, 1.0), tm])])  # fmt: skip
    assert "| claude | on | 1 of 1 | 0 of 1 | 1 of 1 |" in lines[2]
    assert "| codex | on | 0 of 1 | 0 of 1 | - |" in lines[3]
