"""After a decode, the next token of every sequence (argmax for plain greedy, sampler chains otherwise) and,
for those that asked, its log-probabilities (`logprobs`).

A llama.cpp sampler chain over the full vocabulary is slow (on a 49k vocabulary: ~0.3 ms for temperature
sampling, ~3 ms with top_p, which sorts every candidate), and it runs in native code without the GIL. So
when several sequences need their chains in one step, they run on a small thread pool: each chain is used
by one thread at a time and sees exactly the calls it would see serially, so the tokens do not change.

Concurrency contract: `pick` is called by the engine thread only, after `decode` and before the next one.
It fetches the logits with `Model.logits` first, which synchronizes the context and puts llama.cpp's
outputs in batch order, so that the pool's `llama_get_logits_ith` calls only read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Set
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from backends.llamacpp.worker.logprobs import LogprobAsk, step_logprobs
from backends.llamacpp.worker.native import Model
from backends.llamacpp.worker.sampler import Sampler
from backends.llamacpp.worker.sampling import greedy_token
from backends.llamacpp.worker.tickets import TokenLogprob


class Pick(NamedTuple):
    """One sequence's output of the last decode: its `batch_index` and `row` in `Model.logits`; with
    `logprobs` (the number of alternatives) not None, also the entry of the picked token."""

    sampler: Sampler | None  # None: plain greedy
    banned: Set[int]
    batch_index: int
    row: int
    logprobs: int | None = None
    temperature: float = 0.0
    forced: list[int] | None = None
    """Tokens to generate without sampling (a thinking budget's closing), the first one now: it is taken
    off the list and the chain only accepts it."""


class TokenPicker:
    def __init__(self, model: Model, threads: int) -> None:
        self._model = model
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="llama-sampler") if threads > 1 else None

    def pick(self, picks: Sequence[Pick], n_outputs: int) -> list[tuple[int, TokenLogprob | None]]:
        """The next token for each of `picks`, in order, with its entry when asked for (engine thread)."""
        logits = self._model.logits(n_outputs)
        chained = [p for p in picks if p.sampler is not None and not p.forced]
        sampled: Iterator[int]
        if self._pool is not None and len(chained) > 1:
            sampled = self._pool.map(self._sample, chained)  # submitted now; the argmaxes below run meanwhile
        else:
            sampled = iter([self._sample(p) for p in chained])
        greedy = [self._unsampled(p, logits[p.row]) for p in picks]
        tokens = [next(sampled) if token < 0 else token for token in greedy]
        asks = [i for i, p in enumerate(picks) if p.logprobs is not None]
        entries: dict[int, TokenLogprob] = {}
        if asks:
            computed = step_logprobs(
                logits,
                [LogprobAsk(picks[i].row, tokens[i], picks[i].temperature, picks[i].logprobs or 0) for i in asks],
                self._model.piece,
            )
            entries = dict(zip(asks, computed, strict=True))
        return [(token, entries.get(i)) for i, token in enumerate(tokens)]

    def _unsampled(self, pick: Pick, row: Any) -> int:
        """A forced token (accepted by the chain), the argmax of a plain greedy pick, or -1 (sample it)."""
        if pick.forced:
            token = pick.forced.pop(0)
            if pick.sampler is not None:
                pick.sampler.accept(token)
            return token
        return greedy_token(row, pick.banned) if pick.sampler is None else -1

    def _sample(self, pick: Pick) -> int:
        assert pick.sampler is not None
        return pick.sampler.sample(self._model, pick.batch_index)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
