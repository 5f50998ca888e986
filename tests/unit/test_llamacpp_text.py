"""The worker's output text path without a model: UTF-8 joined across token pieces, stop strings held back."""

from __future__ import annotations

import itertools

import pytest

from backends.llamacpp.worker.text import StopMatcher, StopResult, Utf8Stream


def pieces_of(data: bytes, cuts: tuple[int, ...]) -> list[bytes]:
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def split_points(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every way to cut a sequence of length `n` into `parts` non-empty pieces."""
    return list(itertools.combinations(range(1, n), parts - 1))


# --- Utf8Stream -------------------------------------------------------------------------------------


def test_ascii_pieces_pass_straight_through() -> None:
    stream = Utf8Stream()
    assert [stream.push(p) for p in (b"Hel", b"lo", b" world")] == ["Hel", "lo", " world"]


def test_a_two_byte_character_split_across_tokens_waits_for_its_second_byte() -> None:
    stream = Utf8Stream()
    assert stream.push(b"caf\xc3") == "caf"
    assert stream.push(b"\xa9!") == "\u00e9!"


@pytest.mark.parametrize("cuts", split_points(len("a😀b".encode()), 3))
def test_a_four_byte_character_is_never_split_however_the_bytes_arrive(cuts: tuple[int, ...]) -> None:
    stream = Utf8Stream()
    outputs = [stream.push(p) for p in pieces_of("a😀b".encode(), cuts)]
    assert "".join(outputs) == "a😀b"
    assert all("\ufffd" not in o for o in outputs)
    assert any("😀" in o for o in outputs)  # the emoji arrives whole, within one piece of text


def test_invalid_bytes_become_replacement_characters() -> None:
    stream = Utf8Stream()
    assert stream.push(b"a\xffb") == "a\ufffdb"


def test_a_truncated_sequence_followed_by_ascii_is_replaced_not_swallowed() -> None:
    stream = Utf8Stream()
    assert stream.push(b"\xe2\x82") == ""
    assert stream.push(b"x") == "\ufffdx"


def test_flush_drops_an_incomplete_character_and_starts_clean() -> None:
    stream = Utf8Stream()
    assert stream.push(b"ok\xe2\x82") == "ok"
    assert stream.flush() == ""
    assert stream.push(b"\xac") == "\ufffd"  # the euro sign's first bytes are gone, not joined later
    assert stream.push(b"next") == "next"


# --- StopMatcher ------------------------------------------------------------------------------------


def test_without_stop_strings_text_is_released_immediately() -> None:
    matcher = StopMatcher([])
    assert matcher.push("hello <") == StopResult("hello <")
    assert matcher.flush() == ""


def test_a_possible_start_of_a_stop_string_is_held_back() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.push("hello E") == StopResult("hello ")
    assert matcher.push("N") == StopResult("")


def test_held_text_is_released_once_it_cannot_become_a_stop_string() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.push("hello EN") == StopResult("hello ")
    assert matcher.push("D") == StopResult("", "END")

    matcher = StopMatcher(["END"])
    assert matcher.push("hello EN") == StopResult("hello ")
    assert matcher.push("Ds") == StopResult("", "END")

    matcher = StopMatcher(["END"])
    assert matcher.push("hello EN") == StopResult("hello ")
    assert matcher.push("ough") == StopResult("ENough")


def test_the_stop_string_and_everything_after_it_are_never_released() -> None:
    matcher = StopMatcher(["</s>"])
    assert matcher.push("answer</s>more text") == StopResult("answer", "</s>")


def test_the_earliest_stop_string_wins_and_is_named() -> None:
    matcher = StopMatcher(["bar", "ob"])
    assert matcher.push("foobar") == StopResult("fo", "ob")


def test_of_stop_strings_starting_at_the_same_place_the_first_listed_is_named() -> None:
    assert StopMatcher(["abc", "ab"]).push("xabcd") == StopResult("x", "abc")
    assert StopMatcher(["ab", "abc"]).push("xabcd") == StopResult("x", "ab")


def test_a_stop_string_completed_across_pushes_is_named() -> None:
    matcher = StopMatcher(["never", "<|end|>"])
    assert matcher.push("done<|en") == StopResult("done")
    result = matcher.push("d|> more")
    assert (result.text, result.matched, result.stopped) == ("", "<|end|>", True)


def test_text_without_a_stop_string_names_none() -> None:
    result = StopMatcher(["END"]).push("plain text")
    assert (result.matched, result.stopped) == (None, False)


def test_only_the_longest_partial_suffix_is_held() -> None:
    matcher = StopMatcher(["abcd"])
    assert matcher.push("xabcab") == StopResult("xabc")
    assert matcher.flush() == "ab"


def test_overlapping_partial_matches_release_only_what_can_no_longer_match() -> None:
    matcher = StopMatcher(["aab"])
    assert matcher.push("aaa") == StopResult("a")
    assert matcher.push("b") == StopResult("", "aab")


def test_flush_returns_held_text_when_generation_ends_otherwise() -> None:
    matcher = StopMatcher(["###"])
    assert matcher.push("total: 5 #") == StopResult("total: 5 ")
    assert matcher.flush() == "#"
    assert matcher.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    matcher = StopMatcher(["", "zz"])
    assert matcher.push("abc") == StopResult("abc")


TEXT = "The answer is 42.<|end|> ignored"
STOPS = ["<|end|>", "<|user|>"]
BEFORE_STOP = "The answer is 42."


def test_any_chunking_releases_exactly_the_text_before_the_stop() -> None:
    for cuts in split_points(len(TEXT), 3):
        matcher = StopMatcher(STOPS)
        released = ""
        for chunk in pieces_of(TEXT.encode(), cuts):
            result = matcher.push(chunk.decode())
            released += result.text
            # Never anything that a later chunk would have to take back.
            assert BEFORE_STOP.startswith(released), (cuts, released)
            if result.stopped:
                assert result.matched == "<|end|>", cuts
                break
        else:
            pytest.fail(f"the stop string was not found with cuts {cuts}")
        assert released == BEFORE_STOP, cuts


def test_a_multibyte_stop_string_split_across_token_bytes_is_caught() -> None:
    stream, matcher = Utf8Stream(), StopMatcher(["。"])  # U+3002, three bytes in UTF-8
    data = "終わり。次".encode()
    stop_at = data.index("。".encode())
    pieces = (data[: stop_at + 1], data[stop_at + 1 : stop_at + 2], data[stop_at + 2 :])
    results = [matcher.push(stream.push(p)) for p in pieces]
    assert [r.matched for r in results] == [None, None, "。"]
    assert "".join(r.text for r in results) == "終わり"
