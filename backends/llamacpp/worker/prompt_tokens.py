"""A rendered prompt's tokens, tokenized again only where its text changed since an earlier request.

An agent resends its whole conversation every turn, and the worker used to tokenize all of it again: 6-10 ms a
turn for 3.5-5k tokens on a CI core (`bench/results/2026-12-06-turn-overhead-cpu/`), growing with the session.

Why cutting is exact: llama.cpp's tokenizer first cuts its text at every special token of the vocabulary
(`tokenizer_st_partition`: control, user-defined and unknown tokens, the longest first) and then tokenizes each
stretch of plain text on its own, knowing only whether a special token came before it. So the tokens of a text
cut right before a special token `A` are the tokens of the two parts put together, provided

- no special token could straddle the cut (one that ends with the start of `A`, or holds `A` past its first
  character): `safe_anchors` drops such an `A`;
- `A` does not strip the whitespace before it (llama.cpp's LSTRIP attribute), which the part before would keep;
- the vocabulary appends nothing at the end (`add_eos`) and tokenizes plain text piece by piece (SPM, BPE):
  the worker passes no anchors otherwise (`native.Model.cuttable`).

The anchors are the special tokens a chat template writes around its messages (`<|im_start|>`,
`<|start_header_id|>`, `<start_of_turn>`, ...), so a piece is a message; the tokens of each piece are kept by its
text, and a turn tokenizes only the messages that are new or changed. `PromptBuilder` checks the rule once at
start on a rendered sample and tokenizes whole texts if it ever differs.
"""

from __future__ import annotations

import itertools
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

Tokenize = Callable[[str, bool], list[int]]
"""A tokenizer with special tokens parsed: `(text, add_special) -> tokens` (add_special: the BOS token)."""

K = TypeVar("K")
V = TypeVar("V")


@dataclass(frozen=True)
class Special:
    """A token llama.cpp's tokenizer finds in text by itself, as its vocabulary writes it."""

    text: str
    lstrip: bool = False


def _straddles(anchor: str, other: str) -> bool:
    """Whether `other`, starting before a cut at `anchor`, could reach past it: some tail of `other` (from its
    second character on) starts with `anchor` or is the start of `anchor`."""
    for k in range(1, len(other)):
        tail = other[k:]
        if tail.startswith(anchor) or anchor.startswith(tail):
            return True
    return False


def safe_anchors(candidates: Iterable[Special], specials: Sequence[Special]) -> tuple[str, ...]:
    """The texts of `candidates` a prompt may be cut before: no LSTRIP, and no special token of the vocabulary
    (`specials`) that could straddle the cut. Longest first, without duplicates."""
    texts = {s.text for s in specials if s.text}
    safe = {
        c.text
        for c in candidates
        if c.text and not c.lstrip and not any(_straddles(c.text, t) for t in texts if t != c.text)
    }
    return tuple(sorted(safe, key=lambda t: (-len(t), t)))


def cut_points(text: str, anchors: Sequence[str]) -> list[int]:
    """Where in `text` an anchor begins (0 excluded), in order, each once."""
    points: set[int] = set()
    for anchor in anchors:
        at = text.find(anchor, 1)
        while at != -1:
            points.add(at)
            at = text.find(anchor, at + len(anchor))
    return sorted(points)


class Lru(Generic[K, V]):
    """A thread-safe least-recently-used map bounded by the sum of its values' weights."""

    def __init__(self, budget: int, weight: Callable[[V], int]) -> None:
        self.budget = budget
        self._weight = weight
        self._items: OrderedDict[K, V] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        size = self._weight(value)
        if size > self.budget:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._held -= self._weight(old)
            self._items[key] = value
            self._held += size
            while self._held > self.budget:
                _, dropped = self._items.popitem(last=False)
                self._held -= self._weight(dropped)

    def __len__(self) -> int:
        return len(self._items)


PIECE_BUDGET_TOKENS = 1 << 20
"""Tokens kept by piece text: a few dozen agent sessions of 30k tokens. A piece weighs its token count or a
quarter of its characters, whichever is more, so text that makes few tokens (a long run of one character) cannot
hold more than ~4 MiB of text besides the 4 MiB of token ids."""


def _piece_weight(item: tuple[int, array[int]]) -> int:
    characters, tokens = item
    return max(len(tokens), characters // 4)


SHORT_TEXT = 256
"""Texts shorter than this are tokenized whole: nothing to gain by cutting them."""


class PieceTokenizer:
    """Tokenizes text cut before its anchors, each piece's tokens kept by the piece's text (`Lru`).

    With no anchors it is `tokenize` itself. `reused` and `tokenized` count the characters served from the
    kept pieces and those tokenized (for tests and benchmarks)."""

    def __init__(self, tokenize: Tokenize, anchors: Sequence[str], budget_tokens: int = PIECE_BUDGET_TOKENS) -> None:
        self._tokenize = tokenize
        self.anchors = tuple(anchors)
        self._pieces: Lru[str, tuple[int, array[int]]] = Lru(budget_tokens, _piece_weight)
        # What `add_special` puts before the text (the BOS token, or nothing): no vocabulary here appends any.
        self._head = tokenize("", True) if self.anchors else []
        self.reused = 0
        self.tokenized = 0

    def __call__(self, text: str, add_special: bool) -> list[int]:
        if not self.anchors or len(text) < SHORT_TEXT:
            return self._tokenize(text, add_special)
        bounds = [0, *cut_points(text, self.anchors), len(text)]
        tokens = list(self._head) if add_special else []
        for start, end in itertools.pairwise(bounds):
            tokens.extend(self._piece(text[start:end]))
        return tokens

    def _piece(self, piece: str) -> Sequence[int]:
        kept = self._pieces.get(piece)
        if kept is not None:
            self.reused += len(piece)
            return kept[1]
        tokens = array("i", self._tokenize(piece, False))
        self._pieces.put(piece, (len(piece), tokens))
        self.tokenized += len(piece)
        return tokens


def checked_tokenizer(tokenize: Tokenize, sample: str | None, specials: Mapping[int, Special]) -> PieceTokenizer:
    """A `PieceTokenizer` cutting before the safe special tokens a rendered `sample` conversation holds, if it
    tokenizes `sample` exactly as `tokenize` does; one that never cuts otherwise (or with no sample)."""
    if not sample:
        return PieceTokenizer(tokenize, ())
    found = set(tokenize(sample, False)) & specials.keys()
    anchors = safe_anchors([specials[token] for token in sorted(found)], list(specials.values()))
    pieces = PieceTokenizer(tokenize, anchors)
    if anchors and pieces(sample, True) != tokenize(sample, True):
        return PieceTokenizer(tokenize, ())
    return pieces
