"""`EmbeddingEngine`: requests arriving together share rounds, cancellation, back-pressure, shutdown, failure.

Also home of `FakeEmbeddingModel`, which the server tests import.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import pytest

from backends.llamacpp.worker.embedding import (
    EmbeddingEngine,
    EmbeddingModel,
    EngineClosedError,
    Pooling,
    QueueFullError,
    Vectors,
)


class FakeEmbeddingModel:
    """Stands for `EmbeddingModel`: the same attributes and methods, with vectors derived from the tokens.

    A word is one token (its length, +10), framed as `[1] ... [2]` like BERT's [CLS]/[SEP]. Row i of
    `embed` depends only on sequence i (seeded by its tokens), so batching never changes a result.
    `gate`, when set, makes `embed` wait for it (to hold a round in flight); `fail` makes it raise.
    """

    def __init__(
        self,
        *,
        pooling: Pooling = "mean",
        n_out: int = 8,
        max_input_tokens: int = 16,
        n_seq_max: int = 4,
        n_batch: int = 64,
    ) -> None:
        self.pooling: Pooling = pooling
        self.n_out = n_out
        self.max_input_tokens = max_input_tokens
        self.n_seq_max = n_seq_max
        self.n_batch = n_batch
        self.n_vocab = 100
        self.longest_token = 1 << 30  # a word is one token whatever its length: no byte bound holds here
        self.calls: list[list[list[int]]] = []
        self.closed_on: str | None = None
        self.gate: threading.Event | None = None
        self.entered = threading.Event()
        self.fail: Exception | None = None

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = True) -> list[int]:
        words = [10 + len(w) for w in text.split()]
        return [1, *words, 2] if add_special else words

    def rerank_tokens(self, query: str, document: str) -> list[int]:
        return [1, *self.tokenize(query, add_special=False), 2, *self.tokenize(document, add_special=False)]

    def end_tokens(self) -> int:
        return 1

    def embed(self, sequences: Sequence[Sequence[int]]) -> Vectors:
        self.calls.append([list(s) for s in sequences])
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail is not None:
            raise self.fail
        rows = [np.random.default_rng(list(s)).standard_normal(self.n_out) for s in sequences]
        return np.array(rows, dtype=np.float32).reshape(len(sequences), self.n_out)

    def close(self) -> None:
        self.closed_on = threading.current_thread().name


def engine_for(model: FakeEmbeddingModel, **kwargs: Any) -> EmbeddingEngine:
    engine = EmbeddingEngine(cast(EmbeddingModel, model), max_queue=kwargs.pop("max_queue", 16), **kwargs)
    engine.start()
    return engine


async def hold_first_round(model: FakeEmbeddingModel) -> threading.Event:
    """Make the next round block inside `embed` until the returned event is set."""
    gate = threading.Event()
    model.gate = gate
    return gate


async def wait_entered(model: FakeEmbeddingModel) -> None:
    await asyncio.to_thread(model.entered.wait, 5)
    model.entered.clear()


async def test_requests_arriving_while_a_round_runs_share_the_next_round() -> None:
    model = FakeEmbeddingModel(n_seq_max=8)
    engine = engine_for(model)
    gate = await hold_first_round(model)
    first = engine.submit([[1, 5, 2]])
    await wait_entered(model)
    later = [engine.submit([[1, 6 + i, 2], [1, 7 + i, 2]]) for i in range(3)]
    assert engine.stats().queue_depth == 3 and engine.stats().busy
    gate.set()
    results = await asyncio.gather(first, *later)
    assert [len(call) for call in model.calls] == [1, 6]  # the three waiting requests ran as one round
    for future_rows, request in zip(results[1:], [[[1, 6 + i, 2], [1, 7 + i, 2]] for i in range(3)], strict=True):
        np.testing.assert_array_equal(future_rows, model.embed(request))
    stats = engine.stats()
    assert (stats.rounds_total, stats.requests_total, stats.inputs_total, stats.tokens_total) == (2, 4, 7, 21)
    await engine.close()


async def test_a_round_takes_whole_requests_up_to_round_inputs() -> None:
    model = FakeEmbeddingModel(n_seq_max=4)
    engine = engine_for(model)  # round_inputs defaults to n_seq_max
    gate = await hold_first_round(model)
    first = engine.submit([[1, 2]])
    await wait_entered(model)
    sizes = [3, 2, 5, 1]
    futures = [engine.submit([[1, 10 + i, 2]] * n) for i, n in enumerate(sizes)]
    gate.set()
    await asyncio.gather(first, *futures)
    # 3 (+2 would be 5 > 4) | 2 (+5 > 4) | 5 alone, larger than a round | 1
    assert [len(call) for call in model.calls] == [1, 3, 2, 5, 1]
    await engine.close()


async def test_a_request_cancelled_while_queued_never_reaches_the_model() -> None:
    model = FakeEmbeddingModel()
    engine = engine_for(model)
    gate = await hold_first_round(model)
    first = engine.submit([[1, 2]])
    await wait_entered(model)
    gone = engine.submit([[1, 99, 2]])
    kept = engine.submit([[1, 50, 2]])
    gone.cancel()
    gate.set()
    await asyncio.gather(first, kept)
    assert model.calls == [[[1, 2]], [[1, 50, 2]]]
    assert engine.stats().requests_total == 2
    await engine.close()


async def test_a_full_queue_refuses_new_requests() -> None:
    model = FakeEmbeddingModel()
    engine = engine_for(model, max_queue=2)
    gate = await hold_first_round(model)
    running = engine.submit([[1, 2]])
    await wait_entered(model)
    queued = [engine.submit([[1, 3]]), engine.submit([[1, 4]])]
    with pytest.raises(QueueFullError):
        engine.submit([[1, 5]])
    gate.set()
    await asyncio.gather(running, *queued)
    await engine.close()


async def test_shutdown_fails_queued_requests_but_the_running_round_delivers() -> None:
    model = FakeEmbeddingModel()
    engine = engine_for(model)
    gate = await hold_first_round(model)
    running = engine.submit([[1, 2]])
    await wait_entered(model)
    queued = engine.submit([[1, 3]])
    engine.shutdown()
    with pytest.raises(EngineClosedError):
        await queued
    with pytest.raises(EngineClosedError):
        engine.submit([[1, 4]])
    gate.set()
    assert (await running).shape == (1, model.n_out)
    await engine.close()
    assert model.closed_on is not None and model.closed_on.startswith("embedding-engine")


async def test_a_native_failure_fails_its_round_and_the_queue_and_is_fatal() -> None:
    model = FakeEmbeddingModel()
    fatal: list[str] = []
    engine = engine_for(model, on_fatal=fatal.append)
    gate = await hold_first_round(model)
    model.fail = RuntimeError("llama_decode failed with status -3")
    running = engine.submit([[1, 2]])
    await wait_entered(model)
    queued = engine.submit([[1, 3]])
    gate.set()
    for future in (running, queued):
        with pytest.raises(EngineClosedError):
            await future
    assert fatal and "status -3" in fatal[0]
    with pytest.raises(EngineClosedError):
        engine.submit([[1, 4]])
    await engine.close()


async def test_close_waits_for_the_round_in_flight_then_frees_the_model_on_the_engine_thread() -> None:
    model = FakeEmbeddingModel()
    engine = engine_for(model)
    gate = await hold_first_round(model)
    running = engine.submit([[1, 2]])
    await wait_entered(model)
    closing = asyncio.create_task(engine.close())
    await asyncio.sleep(0.05)
    assert not closing.done() and model.closed_on is None
    gate.set()
    await closing
    assert running.done() and running.result().shape == (1, model.n_out)
    assert model.closed_on is not None and model.closed_on.startswith("embedding-engine")
