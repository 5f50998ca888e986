"""The Scheduler in-process on the real SmolLM2 GGUF: logprobs, logit_bias and n > 1 sharing the prompt's KV."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest

from backends.llamacpp.worker.native import ContextOptions, Model
from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.scheduler import QueueFullError, Scheduler
from backends.llamacpp.worker.tickets import Failed, Finished, GenerationRequest, TextDelta, Ticket, TokenLogprob

pytestmark = pytest.mark.integration

SLOTS = 4
CTX = 256
THREADS = 2
PROMPT = "<|im_start|>user\nWrite one sentence about the sea and the wind.<|im_end|>\n<|im_start|>assistant\n"
GREEDY = SamplingParams(temperature=0.0)


@dataclass
class Result:
    text: str
    entries: list[TokenLogprob]
    finished: Finished

    @property
    def token_ids(self) -> list[int]:
        return [e.token_id for e in self.entries]


@pytest.fixture(scope="module")
def model(smollm2_path: Path) -> Iterator[Model]:
    options = ContextOptions(n_ctx_per_seq=CTX, n_seq_max=SLOTS, n_batch=128, n_threads=THREADS)
    loaded = Model(smollm2_path, options)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def reference(smollm2_path: Path) -> Iterator[llama_cpp.Llama]:
    """The same GGUF loaded independently by llama-cpp-python's high-level API, logits at every position.

    Flash attention as in our context: without it the log-probabilities differ by up to ~0.03.
    """
    llm = llama_cpp.Llama(
        str(smollm2_path), logits_all=True, n_ctx=CTX, n_threads=THREADS, flash_attn=True, verbose=False
    )
    yield llm
    llm.close()


@pytest.fixture(scope="module")
def prompt(model: Model) -> tuple[int, ...]:
    return tuple(model.tokenize(PROMPT, add_special=True))


def new_scheduler(model: Model, *, slots: int = SLOTS, max_queue: int = 8, n_batch: int = 128) -> Scheduler:
    """A scheduler over empty KV (a previous test's scheduler left its sequences cached)."""
    for seq_id in range(SLOTS):
        model.seq_clear(seq_id)
    scheduler = Scheduler(model, slots=slots, n_ctx_per_slot=CTX, n_batch=n_batch, max_queue=max_queue)
    scheduler.start()
    return scheduler


@pytest.fixture
def scheduler(model: Model) -> Iterator[Scheduler]:
    running = new_scheduler(model)
    yield running
    running.stop()


def request(
    prompt: Sequence[int],
    sampling: SamplingParams = GREEDY,
    *,
    logprobs: int | None = None,
    max_tokens: int = 12,
    stop: tuple[str, ...] = (),
    ignore_eos: bool = False,
) -> GenerationRequest:
    sampling = replace(sampling, ignore_eos=ignore_eos)
    return GenerationRequest("test", tuple(prompt), sampling, max_tokens=max_tokens, stop=stop, logprobs=logprobs)


async def collect(ticket: Ticket) -> Result:
    text, entries = "", list[TokenLogprob]()
    while True:
        event = await asyncio.wait_for(ticket.next_event(), 30)
        if isinstance(event, TextDelta):
            text += event.text
            entries += event.logprobs
        elif isinstance(event, Failed):
            pytest.fail(f"request failed: {event.message}")
        else:
            return Result(text, entries, event)


async def generate(scheduler: Scheduler, req: GenerationRequest) -> Result:
    return await collect(scheduler.submit(req, asyncio.get_running_loop()))


async def generate_group(scheduler: Scheduler, reqs: Sequence[GenerationRequest]) -> list[Result]:
    tickets = scheduler.submit_group(reqs, asyncio.get_running_loop())
    return list(await asyncio.gather(*(collect(t) for t in tickets)))


def log_softmax_rows(reference: llama_cpp.Llama, tokens: Sequence[int], temperature: float) -> npt.NDArray[np.float64]:
    """log_softmax(logits / T) at every position of `tokens`, from the independent evaluation."""
    reference.reset()  # type: ignore[no-untyped-call]
    reference.eval(list(tokens))
    rows: npt.NDArray[np.float64] = np.asarray(reference.scores[: len(tokens)], dtype=np.float64) / temperature
    rows -= rows.max(axis=1, keepdims=True)
    rows -= np.log(np.exp(rows).sum(axis=1, keepdims=True))
    return rows


# --- logprobs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=0.7, seed=7)], ids=["greedy", "t0.7"])
async def test_logprobs_match_an_independent_evaluation(
    scheduler: Scheduler, reference: llama_cpp.Llama, prompt: tuple[int, ...], sampling: SamplingParams
) -> None:
    result = await generate(scheduler, request(prompt, sampling, logprobs=5, ignore_eos=True))
    assert len(result.entries) == result.finished.usage.completion_tokens == 12
    assert b"".join(bytes(e.bytes) for e in result.entries).decode() == result.text
    expected = log_softmax_rows(reference, prompt + tuple(result.token_ids), sampling.temperature or 1.0)
    for i, entry in enumerate(result.entries):
        row = expected[len(prompt) - 1 + i]
        assert entry.logprob == pytest.approx(row[entry.token_id], abs=1e-3)
        top_ids = [t.token_id for t in entry.top]
        assert top_ids == list(np.argsort(-row, kind="stable")[:5])
        for top in entry.top:
            assert top.logprob == pytest.approx(row[top.token_id], abs=1e-3)


async def test_greedy_top_logprobs_are_sorted_and_start_with_the_pick(
    scheduler: Scheduler, prompt: tuple[int, ...]
) -> None:
    result = await generate(scheduler, request(prompt, logprobs=3))
    assert result.entries
    for entry in result.entries:
        values = [t.logprob for t in entry.top]
        assert len(values) == 3
        assert values == sorted(values, reverse=True)
        assert entry.top[0].token_id == entry.token_id
        assert entry.top[0].logprob == entry.logprob
        assert entry.logprob <= 0.0
        assert entry.token == bytes(entry.bytes).decode("utf-8", "replace")


async def test_logprobs_zero_gives_the_token_without_alternatives_and_none_gives_nothing(
    scheduler: Scheduler, prompt: tuple[int, ...]
) -> None:
    with_entries = await generate(scheduler, request(prompt, logprobs=0))
    without = await generate(scheduler, request(prompt))
    assert with_entries.text == without.text
    assert with_entries.entries and all(e.top == () for e in with_entries.entries)
    assert without.entries == []


async def test_tokens_swallowed_by_a_stop_string_have_no_entries(scheduler: Scheduler, prompt: tuple[int, ...]) -> None:
    free = await generate(scheduler, request(prompt, logprobs=1, ignore_eos=True))
    pieces = [e.token for e in free.entries]
    # The first token, past the third, whose text is new: it becomes the stop string.
    cut = next(i for i in range(3, len(pieces)) if pieces[i].strip() and pieces[i] not in "".join(pieces[:i]))
    stopped = await generate(scheduler, request(prompt, logprobs=1, ignore_eos=True, stop=(pieces[cut],)))
    assert stopped.finished.reason == "stop"
    assert stopped.text == "".join(pieces[:cut])
    assert stopped.token_ids == free.token_ids[:cut]


# --- logit_bias ------------------------------------------------------------------------------------


async def test_logit_bias_plus_100_forces_a_token(scheduler: Scheduler, model: Model, prompt: tuple[int, ...]) -> None:
    forced = model.tokenize(" wave", add_special=False)[0]
    for sampling in (GREEDY, SamplingParams(temperature=1.0, seed=3)):
        biased = replace(sampling, logit_bias=((forced, 100.0),))
        result = await generate(scheduler, request(prompt, biased, logprobs=0, max_tokens=6))
        assert result.token_ids == [forced] * 6


async def test_logit_bias_minus_100_keeps_the_greedy_pick_out(scheduler: Scheduler, prompt: tuple[int, ...]) -> None:
    plain = await generate(scheduler, request(prompt, logprobs=0))
    banned = plain.token_ids[0]
    for sampling in (GREEDY, SamplingParams(temperature=1.5, seed=5)):
        biased = replace(sampling, logit_bias=((banned, -100.0),))
        result = await generate(scheduler, request(prompt, biased, logprobs=0, max_tokens=16))
        assert result.token_ids
        assert banned not in result.token_ids


# --- n > 1 -----------------------------------------------------------------------------------------


def seeded(prompt: Sequence[int], *seeds: int, logprobs: int | None = None) -> list[GenerationRequest]:
    return [request(prompt, SamplingParams(temperature=0.8, seed=seed), logprobs=logprobs) for seed in seeds]


async def test_group_with_one_seed_gives_identical_texts_and_prefills_once(
    scheduler: Scheduler, prompt: tuple[int, ...]
) -> None:
    results = await generate_group(scheduler, seeded(prompt, 42, 42, 42, 42, logprobs=2))
    assert len({r.text for r in results}) == 1
    assert len({tuple(r.entries) for r in results}) == 1
    stats = scheduler.stats()
    assert stats.prefill_tokens_total == len(prompt)
    assert stats.requests_total == 4
    assert [r.finished.usage.prompt_tokens for r in results] == [len(prompt)] * 4
    assert [r.finished.usage.cached_tokens for r in results] == [0] + [len(prompt)] * 3


async def test_group_shares_the_prompt_with_unified_kv_too(smollm2_path: Path, prompt: tuple[int, ...]) -> None:
    options = ContextOptions(n_ctx_per_seq=CTX, n_seq_max=SLOTS, n_batch=128, n_threads=THREADS, kv_unified=True)
    unified = Model(smollm2_path, options)
    try:
        scheduler = new_scheduler(unified)
        try:
            results = await generate_group(scheduler, seeded(prompt, 42, 42, 42))
            assert scheduler.stats().prefill_tokens_total == len(prompt)
        finally:
            scheduler.stop()
    finally:
        unified.close()
    assert len({r.text for r in results}) == 1


async def test_group_with_different_seeds_differs_and_reproduces_run_to_run(
    model: Model, prompt: tuple[int, ...]
) -> None:
    texts = []
    for _ in range(2):
        scheduler = new_scheduler(model)
        try:
            texts.append([r.text for r in await generate_group(scheduler, seeded(prompt, 1, 2, 3, 4))])
            assert scheduler.stats().prefill_tokens_total == len(prompt)
        finally:
            scheduler.stop()
    assert texts[0] == texts[1]
    assert len(set(texts[0])) > 1


async def test_group_members_match_their_solo_runs(scheduler: Scheduler, prompt: tuple[int, ...]) -> None:
    group = [r.text for r in await generate_group(scheduler, seeded(prompt, 11, 12))]
    solo = [(await generate(scheduler, req)).text for req in seeded(prompt, 11, 12)]
    assert group == solo


async def test_group_larger_than_the_free_slots_runs_in_rounds(model: Model, prompt: tuple[int, ...]) -> None:
    scheduler = new_scheduler(model, slots=2, max_queue=4)
    try:
        results = await generate_group(scheduler, seeded(prompt, 9, 9, 9, 9, 9))
        stats = scheduler.stats()
    finally:
        scheduler.stop()
    assert all(r.finished.reason in ("stop", "length") for r in results)
    assert len({r.text for r in results}) == 1
    # Rounds of 2, 2 and 1 (same seed: the members finish together); the first member of a later round
    # finds the prompt in a slot's KV and decodes only its last token again, the second copies its KV.
    assert stats.prefill_tokens_total == len(prompt) + 2


async def test_group_is_admitted_whole_or_not_at_all(model: Model, prompt: tuple[int, ...]) -> None:
    scheduler = new_scheduler(model, slots=2, max_queue=1)
    try:
        with pytest.raises(QueueFullError):
            scheduler.submit_group(seeded(prompt, 1, 2, 3, 4), asyncio.get_running_loop())
        assert scheduler.stats().queue_depth == 0
        results = await generate_group(scheduler, seeded(prompt, 1, 2, 3))
        assert len(results) == 3
    finally:
        scheduler.stop()


async def test_leader_cancelled_while_prefilling_hands_its_followers_over(
    model: Model, prompt: tuple[int, ...]
) -> None:
    long_prompt = prompt[:-8] + prompt[1:-8] * 4 + prompt[-8:]
    scheduler = new_scheduler(model, n_batch=8)  # a prefill of many steps
    try:
        tickets = scheduler.submit_group(seeded(long_prompt, 5, 5, 5), asyncio.get_running_loop())
        while scheduler.stats().prefill_tokens_total == 0:
            await asyncio.sleep(0.001)
        tickets[0].cancel()
        results = await asyncio.gather(*(collect(t) for t in tickets))
        stats = scheduler.stats()
    finally:
        scheduler.stop()
    assert results[0].finished.reason == "cancelled"
    assert stats.prefill_tokens_total > len(long_prompt)  # the heir prefilled the prompt itself
    assert results[1].text == results[2].text
    assert results[1].finished.reason in ("stop", "length")
