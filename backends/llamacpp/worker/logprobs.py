"""Log-probabilities of generated tokens: computed from a decode step's logits, handed over with their text.

What is reported
----------------
log_softmax(logits / T) over the whole vocabulary, with T the request's temperature when it is > 0 and 1
for greedy: the model's distribution after temperature, which is what OpenAI reports. It is taken before
logit_bias, the penalties, a grammar and top-k/top-p/min-p truncation, so a token forced by logit_bias
may show a low log-probability, and an alternative may be listed that the sampler could not have picked.

Concurrency contract: `step_logprobs` runs on the engine thread, after the step's picks and before the
next decode, because the rows it reads are a view of llama.cpp's output buffer (`Model.logits`). One
vectorised pass serves every sequence of the step that asked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from backends.llamacpp.worker.tickets import TokenLogprob, TopLogprob


class LogprobAsk(NamedTuple):
    """One sequence's share of a step: its `row` in the logits, the `token` it picked, how many `top`."""

    row: int
    token: int
    temperature: float
    top: int


def step_logprobs(
    logits: npt.NDArray[np.float32], asks: Sequence[LogprobAsk], piece: Callable[[int], bytes]
) -> list[TokenLogprob]:
    """Each ask's chosen-token entry with its `top` alternatives, most likely first (ties: lower id first).

    The chosen token is among the alternatives whenever it is one of the `top` most likely, even on a tie
    at the boundary. `piece` gives a token's bytes.
    """
    if not asks:
        return []
    rows = logits[[ask.row for ask in asks]].astype(np.float64)  # a copy: the view stays untouched
    rows /= np.array([ask.temperature if ask.temperature > 0 else 1.0 for ask in asks])[:, None]
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))  # stable log-softmax: the max is now 0
    k_max = min(max(ask.top for ask in asks), rows.shape[1])
    candidates = np.argpartition(-rows, k_max - 1, axis=1)[:, :k_max] if k_max > 0 else None
    entries = []
    for i, ask in enumerate(asks):
        top: list[int] = []
        if candidates is not None and ask.top > 0:
            ids = candidates[i]
            top = [int(t) for t in ids[np.lexsort((ids, -rows[i, ids]))][: ask.top]]
            if ask.token not in top and rows[i, ask.token] >= rows[i, top[-1]]:
                top[-1] = ask.token  # a tie at the boundary that argpartition broke the other way
                top.sort(key=lambda t: (-rows[i, t], t))
        alternatives = tuple(TopLogprob(*_text(t, piece), float(rows[i, t])) for t in top)
        entries.append(TokenLogprob(*_text(ask.token, piece), float(rows[i, ask.token]), alternatives))
    return entries


def _text(token: int, piece: Callable[[int], bytes]) -> tuple[int, str, tuple[int, ...]]:
    data = piece(token)
    return token, data.decode("utf-8", "replace"), tuple(data)


class _Waiting(NamedTuple):
    entry: TokenLogprob
    start: int  # character offsets of the token's text in the sequence's generated text
    end: int


class LogprobQueue:
    """One sequence's token entries, each waiting for the delta that releases the end of its text.

    Offsets count characters of the text as the stop matcher sees it (after UTF-8 decoding). A token that
    produced no character yet (an incomplete multi-byte character, or a token that renders empty) goes
    out with the next token that does.
    """

    def __init__(self) -> None:
        self._waiting: deque[_Waiting] = deque()
        self._open: list[TokenLogprob] = []  # produced no character yet
        self._produced = 0
        self._released = 0

    def add(self, entry: TokenLogprob, n_chars: int) -> None:
        """A token's entry, and how many characters its piece added to the text."""
        if n_chars == 0:
            self._open.append(entry)
            return
        start, self._produced = self._produced, self._produced + n_chars
        self._waiting.extend(_Waiting(e, start, self._produced) for e in self._open)
        self._open.clear()
        self._waiting.append(_Waiting(entry, start, self._produced))

    def release(self, n_chars: int, *, stopped: bool = False, final: bool = False) -> tuple[TokenLogprob, ...]:
        """The entries that go out with a delta releasing `n_chars` more characters.

        `stopped`: the text ended in a stop string, so the entries of tokens none of whose text was
        released are dropped. `final`: the sequence ended otherwise, so everything left goes out.
        """
        self._released += n_chars
        everything = final and not stopped
        out: list[TokenLogprob] = []
        while self._waiting:
            head = self._waiting[0]
            if not (everything or head.end <= self._released or (stopped and head.start < self._released)):
                break
            out.append(self._waiting.popleft().entry)
        if everything:
            out += self._open
        if final or stopped:
            self._waiting.clear()
            self._open.clear()
        return tuple(out)
