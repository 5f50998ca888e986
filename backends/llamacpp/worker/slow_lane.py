"""Sampling that would stall every stream, taken off the engine's step (issue 35).

A llama.cpp grammar sampler checks every candidate token against the grammar's stacks at each step: with a
JSON schema's 20,000-value enum that took ~5 s per token on a 2-core Xeon (2,000 values: ~0.6 s), and while
one sequence samples, every other sequence on the worker waits for the step to end. So a sequence whose
grammar is larger than `HEAVY_GRAMMAR_BYTES` samples here instead: after a decode its logits row is copied,
the step goes on without it, and one background thread builds its sampler chain (once: a 20,000-value
grammar takes ~0.7 s to build) and picks the token from the copy (`Sampler.sample_row`). The engine takes
the token in its next round, and the sequence joins the step after. The other streams keep their pace; the
heavy sequence decodes at the pace its grammar allows.

Time bound: a grammar that needs longer than `step_limit_s` to give one token (its sampler's build
included) is refused: the request ends with a 400 (`invalid_request_error`, an error frame once streaming)
naming the time and the limit, and the grammar is remembered (the last `REMEMBERED_SLOW`), so that the same
grammar sent again is refused at admission, before any work (`check`). Since grammars are checked after the
chain's pick (`sampler`), a model that follows its schema rarely pays a whole-vocabulary grammar pass.

Ownership: while a job runs it owns its sequence's sampler. A sequence released meanwhile (a client that
left, a shutdown) leaves the sampler to the job, and the engine closes it when the job's result comes back
(native code cannot be interrupted; a job is one token's sampling at most).

Concurrency contract: `submit`, `holds` and `collect` are called by the engine thread only; `has_done` by
the engine thread under its condition's lock; a finished job calls `wake` (which takes that lock) after its
result is visible to `has_done`, so an engine that checked `has_done` under the lock cannot miss it.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from backends.llamacpp.worker.logprobs import LogprobAsk, step_logprobs
from backends.llamacpp.worker.native import NativeError
from backends.llamacpp.worker.sampler import Sampler
from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.tickets import Failed, TokenLogprob

if TYPE_CHECKING:
    from backends.llamacpp.worker.native import Model
    from backends.llamacpp.worker.slots import SeqState

# A grammar (GBNF text) longer than this samples in the slow lane: a 2,000-value enum's (~50 KB) took
# ~0.6 s a token, ten decode steps of a small model; JSON mode and tool-call grammars stay far below.
HEAVY_GRAMMAR_BYTES = 32 * 1024
# One token of a heavy grammar may take this long (worker --grammar-step-limit-s, config
# llamacpp.grammar_step_limit_s): a 20,000-value enum's first token took ~5 s on a 2-core Xeon.
DEFAULT_GRAMMAR_STEP_LIMIT_S = 10.0
REMEMBERED_SLOW = 64


class GrammarTooSlow(NativeError):
    """A grammar this worker timed over its step limit before: refused at admission with a 400."""

    client_error = True


def is_heavy(sampling: SamplingParams) -> bool:
    return sampling.grammar is not None and len(sampling.grammar) > HEAVY_GRAMMAR_BYTES


@dataclass(frozen=True)
class Done:
    """A job's result: the token and its logprob entry, or the error that ended it (`token` -1)."""

    seq: SeqState
    token: int
    entry: TokenLogprob | None
    error: str | None = None
    client_error: bool = False  # the request's grammar was over the time bound: a 400, not the worker's fault

    def failure(self) -> Failed:
        if self.client_error:
            return Failed(self.error or "", invalid=True)
        return Failed(f"sampling failed: {self.error}")


def _key(sampling: SamplingParams) -> int:
    return hash((sampling.grammar, sampling.grammar_triggers))


def too_slow_message(sampling: SamplingParams, took_s: float, limit_s: float) -> str:
    size = len(sampling.grammar or "")
    return (
        f"the request's grammar (from its response_format or tools; {size:,} bytes of GBNF) took {took_s:.1f} s "
        f"to give one token, over this worker's limit of {limit_s:g} s (llamacpp.grammar_step_limit_s): "
        "ask for a smaller schema (e.g. fewer enum values)"
    )


class SlowLane:
    def __init__(
        self, model: Model, wake: Callable[[], None], step_limit_s: float = DEFAULT_GRAMMAR_STEP_LIMIT_S
    ) -> None:
        self._model = model
        self._wake = wake
        self._limit_s = step_limit_s
        self._too_slow: OrderedDict[int, float] = OrderedDict()  # grammar key -> the seconds its token took
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="llama-slow-sampler")
        self._lock = threading.Lock()
        self._done: list[Done] = []
        self._held: set[int] = set()  # id() of the sequences whose job is out (engine thread)

    def submit(self, seq: SeqState, row: npt.NDArray[np.float32]) -> None:
        """Sample `seq`'s next token from a copy of its logits `row` on the background thread."""
        self._held.add(id(seq))
        self._pool.submit(self._run, seq, np.array(row, dtype=np.float32, copy=True))

    def check(self, sampling: SamplingParams) -> None:
        """Raise `GrammarTooSlow` for a heavy grammar that was over the time bound before (engine thread)."""
        if not is_heavy(sampling):
            return
        with self._lock:
            took = self._too_slow.get(_key(sampling))
        if took is not None:
            raise GrammarTooSlow(too_slow_message(sampling, took, self._limit_s))

    def holds(self, seq: SeqState) -> bool:
        return id(seq) in self._held

    def has_done(self) -> bool:
        with self._lock:
            return bool(self._done)

    def collect(self) -> list[Done]:
        """The finished jobs since the last call; their sequences are no longer held."""
        with self._lock:
            done, self._done = self._done, []
        for result in done:
            self._held.discard(id(result.seq))
        return done

    def close(self) -> list[Done]:
        """Wait for the jobs that run, stop the thread; every result not collected yet."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        return self.collect()

    def _run(self, seq: SeqState, row: npt.NDArray[np.float32]) -> None:
        start = time.perf_counter()
        try:
            if seq.sampler is None:
                seq.sampler = Sampler(self._model, seq.request.sampling)
            token = seq.sampler.sample_row(row)
            entry = None
            if seq.request.logprobs is not None:
                ask = LogprobAsk(0, token, seq.request.sampling.temperature, seq.request.logprobs)
                entry = step_logprobs(row[None, :], [ask], self._model.piece)[0]
            result = Done(seq, token, entry)
        except Exception as exc:  # a grammar llama.cpp refuses, a sampler that selects nothing
            result = Done(seq, -1, None, str(exc))
        took = time.perf_counter() - start
        if result.error is None and took > self._limit_s:
            result = Done(seq, -1, None, self._remember(seq.request.sampling, took), client_error=True)
        with self._lock:
            self._done.append(result)
        self._wake()

    def _remember(self, sampling: SamplingParams, took_s: float) -> str:
        with self._lock:
            self._too_slow[_key(sampling)] = took_s
            while len(self._too_slow) > REMEMBERED_SLOW:
                self._too_slow.popitem(last=False)
        return too_slow_message(sampling, took_s, self._limit_s)
