"""Log-probabilities from logits rows, and which delta each token's entry rides with."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
import pytest

from backends.llamacpp.worker.logprobs import LogprobAsk, LogprobQueue, step_logprobs
from backends.llamacpp.worker.reasoning import ReasoningSyntax, ThinkingBudget
from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.slots import SeqState, Slot
from backends.llamacpp.worker.tickets import GenerationRequest, Ticket, TokenLogprob

PIECES = {0: b"a", 1: b"b", 2: b"\xe2\x82", 3: b"\xac", 4: b" c"}


def piece(token: int) -> bytes:
    return PIECES.get(token, b"<%d>" % token)


def naive_log_softmax(row: npt.NDArray[np.float32], temperature: float) -> npt.NDArray[np.float64]:
    scaled: npt.NDArray[np.float64] = row.astype(np.float64) / temperature
    peak = scaled.max()
    scaled -= np.log(np.sum(np.exp(scaled - peak))) + peak
    return scaled


def test_logprobs_are_the_log_softmax_after_temperature_with_greedy_at_one() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((3, 50)) * 8).astype(np.float32)
    asks = [LogprobAsk(0, 7, 0.0, 4), LogprobAsk(2, 11, 0.5, 0), LogprobAsk(1, 3, 1.7, 20)]
    for ask, entry in zip(asks, step_logprobs(logits, asks, piece), strict=True):
        expected = naive_log_softmax(logits[ask.row], ask.temperature or 1.0)
        assert entry.token_id == ask.token
        assert entry.logprob == pytest.approx(expected[ask.token], abs=1e-9)
        assert [t.token_id for t in entry.top] == list(np.argsort(-expected, kind="stable")[: ask.top])
        assert [t.logprob for t in entry.top] == pytest.approx(sorted(expected, reverse=True)[: ask.top], abs=1e-9)


def test_huge_logits_do_not_overflow() -> None:
    logits = np.array([[1e4, 1e4 - 1.0, -1e4]], dtype=np.float32)
    (entry,) = step_logprobs(logits, [LogprobAsk(0, 0, 1.0, 3)], piece)
    assert entry.logprob == pytest.approx(-np.log1p(np.exp(-1.0)))
    assert all(np.isfinite(t.logprob) for t in entry.top[:2])


def test_a_chosen_token_tied_at_the_boundary_is_among_the_alternatives() -> None:
    logits = np.array([[0.0, 5.0, 5.0, 5.0, 1.0]], dtype=np.float32)
    (one,) = step_logprobs(logits, [LogprobAsk(0, 3, 1.0, 1)], piece)
    (two,) = step_logprobs(logits, [LogprobAsk(0, 3, 1.0, 2)], piece)
    (other,) = step_logprobs(logits, [LogprobAsk(0, 4, 1.0, 2)], piece)
    assert [t.token_id for t in one.top] == [3]
    assert [t.token_id for t in two.top] == [1, 3]
    assert [t.token_id for t in other.top] == [1, 2]  # ties go to the lower id


def test_token_text_replaces_invalid_utf8_and_bytes_stay_raw() -> None:
    (entry,) = step_logprobs(np.zeros((1, 5), dtype=np.float32), [LogprobAsk(0, 2, 1.0, 0)], piece)
    assert (entry.token, entry.bytes, entry.top) == ("\ufffd", (0xE2, 0x82), ())


def entry(token: int) -> TokenLogprob:
    return TokenLogprob(token, "", (), -1.0)


def test_entries_wait_for_the_delta_that_releases_their_text() -> None:
    queue = LogprobQueue()
    queue.add(entry(0), 3)
    assert queue.release(1) == ()  # two of its three characters are held back
    queue.add(entry(1), 2)
    assert queue.release(2) == (entry(0),)
    assert queue.release(2) == (entry(1),)


def test_a_token_without_characters_goes_with_the_next_one_that_has_some() -> None:
    queue = LogprobQueue()
    queue.add(entry(2), 0)  # the first bytes of a multi-byte character
    assert queue.release(0) == ()
    queue.add(entry(3), 1)
    assert queue.release(1) == (entry(2), entry(3))


def test_at_a_stop_string_tokens_with_released_text_go_and_the_rest_are_dropped() -> None:
    queue = LogprobQueue()
    for token, n_chars in ((0, 2), (1, 3), (4, 2)):  # text "ab" + "c\n\n" + "xy", stop "\n\n" at offset 3
        queue.add(entry(token), n_chars)
    assert queue.release(3, stopped=True) == (entry(0), entry(1))
    assert queue.release(0, final=True) == ()


def test_the_final_release_carries_everything_left() -> None:
    queue = LogprobQueue()
    queue.add(entry(0), 2)
    queue.add(entry(2), 0)  # an incomplete character cut by max_tokens
    assert queue.release(1) == ()
    assert queue.release(1, final=True) == (entry(0), entry(2))


class FakeModel:
    """Stands for `native.Model`: SeqState only reads its end-of-generation ids."""

    eog_ids = frozenset({99})


def sequence(stop: tuple[str, ...], budget: ThinkingBudget | None = None) -> SeqState:
    request = GenerationRequest("r", (1, 2), SamplingParams(), stop=stop, logprobs=0, thinking_budget=budget)
    ticket = Ticket(request, asyncio.new_event_loop(), lambda: None)
    ticket.loop.close()
    return SeqState(ticket, Slot(0), None, FakeModel(), group=1, cached_tokens=0)  # type: ignore[arg-type]


def test_sequence_sends_entries_with_text_held_back_by_a_possible_stop_string() -> None:
    seq = sequence(stop=("STOP",))
    first = seq.push(b"hi S", entry(0))
    assert (first.text, first.logprobs) == ("hi ", ())
    second = seq.push(b"un", entry(1))
    assert (second.text, second.logprobs, second.matched) == ("Sun", (entry(0), entry(1)), None)
    third = seq.push(b" ST", entry(4))
    fourth = seq.push(b"OP!", entry(3))
    assert (third.text, third.logprobs) == (" ", ())
    assert (fourth.text, fourth.logprobs, fourth.matched) == ("", (entry(4),), "STOP")
    assert fourth.stopped


def test_sequence_flush_sends_held_text_with_its_entries() -> None:
    seq = sequence(stop=("STOP",))
    pushed = seq.push(b"ok ST", entry(0))
    assert (pushed.text, pushed.logprobs) == ("ok ", ())
    flushed = seq.flush()
    assert (flushed.text, flushed.logprobs, flushed.matched) == ("ST", (entry(0),), None)
    assert not flushed.stopped


def test_sequence_names_the_stop_string_that_ended_it_of_several() -> None:
    seq = sequence(stop=("never", "END", "EN"))
    first = seq.push(b"one E", entry(0))
    assert (first.text, first.matched) == ("one ", None)
    ended = seq.push(b"ND two", entry(1))
    assert (ended.text, ended.matched) == ("", "END")  # END and EN start at the same place: END is listed first


def test_a_budget_cut_models_own_closing_tag_is_hidden_and_its_entry_still_goes_out() -> None:
    """Past a 1-token budget the sequence forces the closing (token 7); the model then closes its thought
    itself: that `</think>` is not shown, and the entries of the tokens that wrote it go out once it is hidden."""
    seq = sequence(stop=(), budget=ThinkingBudget(1, (7,), ReasoningSyntax("deepseek"), "thinking"))
    assert seq.push(b"idea", entry(0)).text == "idea" and seq.forced == [7]
    assert seq.push(b"</think>", entry(7)).text == "</think>"  # the forced closing (the scheduler pops it)
    held = seq.push(b"more </th", entry(1))
    assert (held.text, held.logprobs) == ("more ", ())  # "</th" may start the tag: held with its token's entry
    hidden = seq.push(b"ink>", entry(2))
    assert (hidden.text, hidden.logprobs) == ("", (entry(1), entry(2)))
    assert seq.push(b"\n\nHi", entry(3)).logprobs == (entry(3),)
    assert seq.push(b" </think>", entry(4)).text == " "  # and every later one
