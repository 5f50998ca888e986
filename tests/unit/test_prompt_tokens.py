"""The pure parts of the worker's piecewise prompt tokenization (`backends/llamacpp/worker/prompt_tokens.py`).

The tokenizer here is a model of llama.cpp's (special tokens found first, the longest first; plain text
between them tokenized on its own, a token a character); that the real tokenizer gives the same tokens cut as
whole is tested on SmolLM2 in tests/integration/test_prompt_pieces.py and on llama.cpp's 19 test vocabularies
in bench/results/2026-12-06-prompt-pieces/.
"""

from __future__ import annotations

import pytest

from backends.llamacpp.worker.prompt_tokens import (
    SHORT_TEXT,
    Lru,
    PieceTokenizer,
    Special,
    checked_tokenizer,
    cut_points,
    safe_anchors,
)

SPECIALS = {1: Special("<s>"), 2: Special("<|im_start|>"), 3: Special("<|im_end|>")}
BOS = 1


class PartitionTokenizer:
    """llama.cpp's rule in small: specials first (longest first), then each character of plain text."""

    def __init__(self, specials: dict[int, Special] = SPECIALS) -> None:
        self.ids = {s.text: i for i, s in specials.items()}
        self.calls: list[str] = []

    def __call__(self, text: str, add_special: bool) -> list[int]:
        self.calls.append(text)
        out = [BOS] if add_special else []
        i = 0
        by_length = sorted(self.ids, key=len, reverse=True)
        while i < len(text):
            hit = next((s for s in by_length if text.startswith(s, i)), None)
            out.append(self.ids[hit] if hit else 1000 + ord(text[i]))
            i += len(hit) if hit else 1
        return out


def chat(*contents: str) -> str:
    return "".join(f"<|im_start|>user\n{c}<|im_end|>\n" for c in contents) + "<|im_start|>assistant\n"


LONG = "x" * SHORT_TEXT


def test_a_text_cut_before_its_markers_gives_the_whole_texts_tokens_and_reuses_its_pieces() -> None:
    tokenize = PartitionTokenizer()
    pieces = PieceTokenizer(tokenize, ("<|im_start|>", "<|im_end|>"))
    first = chat(LONG, "second")
    assert pieces(first, True) == tokenize(first, True)
    tokenized = pieces.tokenized
    tokenize.calls.clear()
    later = chat(LONG, "second", "third")
    assert pieces(later, True) == tokenize(later, True)[: len(pieces(later, True))]
    assert pieces.reused >= len(LONG)  # the unchanged messages come from the kept pieces
    assert pieces.tokenized - tokenized < len(later) - len(LONG)
    assert all(LONG not in call for call in tokenize.calls[:-1])  # only the new pieces went to the tokenizer


def test_the_bos_token_comes_first_once_whatever_the_first_piece() -> None:
    tokenize = PartitionTokenizer()
    pieces = PieceTokenizer(tokenize, ("<|im_start|>",))
    text = chat(LONG)
    assert pieces(text, True)[:2] == [BOS, 2]
    assert pieces(text, False) == tokenize(text, False)


def test_short_texts_and_no_anchors_go_to_the_tokenizer_whole() -> None:
    tokenize = PartitionTokenizer()
    assert PieceTokenizer(tokenize, ("<|im_start|>",))("<|im_start|>hi", True) == [BOS, 2, 1104, 1105]
    assert tokenize.calls[-1] == "<|im_start|>hi"
    whole = PieceTokenizer(tokenize, ())
    whole(chat(LONG), True)
    assert tokenize.calls[-1] == chat(LONG) and whole.reused == whole.tokenized == 0


@pytest.mark.parametrize(
    ("anchor", "other", "safe"),
    [
        ("<|im_start|>", "<|im_end|>", True),
        (">>TITLE<<", "<|endoftext|>", False),  # "<|endoftext|" + ">>TITLE<<": the longer token takes the ">"
        ("<b>", "x<b>y", False),  # holds the anchor past its first character
        ("<b>", "<b>y", True),  # starts with it: matched at the cut in both tokenizations
        ("<start>", "<s", True),
        ("art>", "<start>", False),
    ],
)
def test_an_anchor_is_safe_only_if_no_special_token_could_straddle_the_cut(anchor: str, other: str, safe: bool) -> None:
    assert safe_anchors([Special(anchor)], [Special(anchor), Special(other)]) == ((anchor,) if safe else ())


def test_an_anchor_that_strips_the_whitespace_before_it_is_not_safe() -> None:
    assert safe_anchors([Special("<|end|>", lstrip=True)], [Special("<|end|>", lstrip=True)]) == ()


def test_cut_points_are_every_anchors_starts_in_order_never_zero() -> None:
    text = "<a>x<bb>y<a><bb>"
    assert cut_points(text, ("<bb>", "<a>")) == [4, 9, 12]


def test_the_lru_drops_the_least_recently_used_past_its_budget() -> None:
    lru: Lru[str, str] = Lru(6, len)
    lru.put("a", "aaa")
    lru.put("b", "bbb")
    assert lru.get("a") == "aaa"
    lru.put("c", "cc")  # over 6: "b" (least recently used) goes
    assert lru.get("b") is None and lru.get("a") == "aaa" and lru.get("c") == "cc"
    lru.put("big", "x" * 7)  # over the whole budget: not kept, nothing dropped
    assert lru.get("big") is None and len(lru) == 2


def test_checked_tokenizer_cuts_before_the_samples_safe_specials() -> None:
    tokenize = PartitionTokenizer()
    pieces = checked_tokenizer(tokenize, chat(LONG, LONG), SPECIALS)
    assert pieces.anchors == ("<|im_start|>", "<|im_end|>")


def test_checked_tokenizer_tokenizes_whole_when_cutting_changes_the_sample() -> None:
    plain = PartitionTokenizer()

    def by_offset(text: str, add_special: bool) -> list[int]:  # a token depends on where in the text it is
        return [t + 10_000 * (i % 2) if t >= 1000 else t for i, t in enumerate(plain(text, add_special))]

    sample = chat(LONG + "y", LONG)
    assert checked_tokenizer(by_offset, sample, SPECIALS).anchors == ()
    assert checked_tokenizer(plain, sample, SPECIALS).anchors != ()  # the same sample, a tokenizer that cuts
    assert checked_tokenizer(plain, None, SPECIALS).anchors == ()


def test_a_piece_of_few_tokens_weighs_its_characters() -> None:
    def one_token(text: str, add_special: bool) -> list[int]:  # a whole piece is one token, whatever its length
        return [7]

    pieces = PieceTokenizer(one_token, ("<|im_start|>",), budget_tokens=800)
    text = "<|im_start|>" + "a" * 3000 + "<|im_start|>" + "b" * 300
    pieces(text, False)  # the pieces weigh 3,012 // 4 = 753 and 312 // 4 = 78: over 800 together
    first, second = text[:3012], text[3012:]
    assert pieces._pieces.get(first) is None and pieces._pieces.get(second) is not None
