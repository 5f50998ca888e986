"""A heavy grammar samples off the engine's step (issue 35, item 1), on the real worker and SmolLM2: a JSON
schema's large enum beside a running stream no longer stalls it; the heavy request still answers within its
schema; a client that leaves mid-way frees its slot; a grammar past the bound is a 400 that names the
parameter; and `Sampler.sample_row` (the slow lane's sampling from a copied logits row) picks exactly the
tokens `Sampler.sample` picks from the context."""

from __future__ import annotations

import asyncio
import ctypes
import itertools
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from backends.llamacpp.worker.slow_lane import HEAVY_GRAMMAR_BYTES
from backends.llamacpp.worker.tools import schema_grammar
from tests.integration.test_llamacpp_worker import MODEL
from tests.integration.test_prompt_cache_worker import running

pytestmark = pytest.mark.integration


def enum_schema(n: int) -> dict[str, Any]:
    rng = random.Random(n)
    return {"type": "string", "enum": [f"value-{i}-{rng.randrange(10**6)}" for i in range(n)]}


HEAVY = enum_schema(4000)  # ~0.1 MB of grammar: ~1 s a token on this CPU, ~25 decode steps of SmolLM2


def heavy_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Pick one value."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": HEAVY}},
        "max_tokens": 40,
        "temperature": 0,
        **extra,
    }


async def timed_stream(client: httpx.AsyncClient, url: str, n: int) -> tuple[list[float], float]:
    """A plain greedy stream of `n` tokens: the times its chunks came, and when it ended."""
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": n, "ignore_eos": True, "temperature": 0,
            "stream": True}  # fmt: skip
    times: list[float] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: {"):
                times.append(time.monotonic())
    return times, time.monotonic()


def test_the_heavy_grammar_is_over_the_slow_lane_threshold() -> None:
    assert len(schema_grammar(HEAVY)) > HEAVY_GRAMMAR_BYTES


def test_a_large_enum_does_not_stall_a_stream_beside_it(smollm2_path: Path, tmp_path: Path) -> None:
    async def scenario(url: str) -> tuple[dict[str, Any], float, list[float], float]:
        async with httpx.AsyncClient(timeout=600) as client:
            heavy = asyncio.create_task(client.post(f"{url}/v1/chat/completions", json=heavy_body()))
            await asyncio.sleep(1.0)  # admitted, prefilled and sampling its first token
            times, stream_end = await timed_stream(client, url, 48)
            reply = await heavy
            heavy_end = time.monotonic()
            assert reply.status_code == 200, reply.text
            return reply.json(), heavy_end, times, stream_end

    with running(smollm2_path, tmp_path, "--slots", "2", "--ctx", "4096") as worker:
        reply, heavy_end, times, stream_end = asyncio.run(scenario(worker.url))
        health = worker.health()
    gaps = [b - a for a, b in itertools.pairwise(times)]
    # Sampled on the step, the heavy request's first tokens held every step for 1-3 s (measured: largest gap
    # 3.2 s, 30x the stream's median, and both ended in the same step). Off the step the stream keeps its own
    # pace (largest gap 1.7x its median) and ends long before the heavy request. A ratio within one run.
    assert max(gaps) < 10 * statistics.median(gaps), (max(gaps), statistics.median(gaps))
    assert stream_end < heavy_end, (stream_end, heavy_end)
    content = reply["choices"][0]["message"]["content"]
    assert json.loads(content) in HEAVY["enum"], content
    assert health["requests_total"] >= 2


def test_a_client_that_leaves_a_heavy_request_frees_its_slot(smollm2_path: Path, tmp_path: Path) -> None:
    async def scenario(url: str) -> httpx.Response:
        async with httpx.AsyncClient(timeout=600) as client:
            async with client.stream("POST", f"{url}/v1/chat/completions", json=heavy_body(stream=True)) as first:
                assert first.status_code == 200
                async for _ in first.aiter_lines():
                    break  # the role chunk: admitted; then the client goes
            return await client.post(f"{url}/v1/chat/completions", json=heavy_body(max_tokens=3))

    with running(smollm2_path, tmp_path) as worker:  # one slot: the second request needs the first's
        second = asyncio.run(scenario(worker.url))
        deadline = time.monotonic() + 60
        while worker.health()["aborted_total"] < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        health = worker.health()
    assert second.status_code == 200, second.text
    assert health["aborted_total"] >= 1 and health["slots_busy"] == 0, health


def test_a_grammar_past_the_bound_is_a_400_naming_response_format(smollm2_path: Path, tmp_path: Path) -> None:
    body = heavy_body()
    body["response_format"]["json_schema"]["schema"] = enum_schema(45_000)
    with running(smollm2_path, tmp_path) as worker:
        reply = httpx.post(f"{worker.url}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "response_format" and "MiB" in error["message"], error


def test_sample_row_picks_what_sample_picks(smollm2_path: Path) -> None:
    from backends.llamacpp.worker.native import Batch, ContextOptions, Model
    from backends.llamacpp.worker.sampler import Sampler
    from backends.llamacpp.worker.sampling import SamplingParams

    model = Model(smollm2_path, ContextOptions(n_ctx_per_seq=512, n_seq_max=1, n_threads=2, cache_type="bf16"))
    try:
        params = SamplingParams(temperature=0.9, top_p=0.9, seed=7, grammar=schema_grammar(enum_schema(50)))
        on_context, on_copy = Sampler(model, params), Sampler(model, params)
        batch = Batch(64)
        tokens = model.tokenize("Pick one value:", add_special=True)
        batch.add_run(tokens, 0, 0, logits=True)
        position, picked = len(tokens), []
        for _ in range(8):
            model.decode(batch)
            a = on_context.sample(model, batch.n_tokens - 1)
            b = on_copy.sample_row(model.logits(batch.n_outputs)[batch.n_outputs - 1].copy())
            assert a == b
            picked.append(a)
            batch.clear()
            batch.add_run([a], position, 0, logits=True)
            position += 1
        on_context.close()
        on_copy.close()
    finally:
        model.close()
    assert len(set(picked)) > 1


def test_a_grammar_over_the_time_bound_is_a_400_and_the_same_grammar_is_refused_before_any_work(
    smollm2_path: Path, tmp_path: Path
) -> None:
    with running(smollm2_path, tmp_path, "--grammar-step-limit-s", "0.000001") as worker:
        first = httpx.post(f"{worker.url}/v1/chat/completions", json=heavy_body(), timeout=120)
        after_first = worker.health()
        again = httpx.post(f"{worker.url}/v1/chat/completions", json=heavy_body(), timeout=120)
        after_again = worker.health()
        light = httpx.post(
            f"{worker.url}/v1/chat/completions",
            json={**heavy_body(), "response_format": {"type": "json_object"}, "max_tokens": 8},
            timeout=120,
        )
    assert first.status_code == 400, first.text
    error = first.json()["error"]
    assert error["type"] == "invalid_request_error" and "over this worker's limit of 1e-06 s" in error["message"]
    assert "grammar_step_limit_s" in error["message"] and "fewer enum values" in error["message"]
    # Refused at admission: no prompt token of it was decoded.
    assert again.status_code == 400, again.text
    assert again.json()["error"]["message"].startswith("the request's grammar")
    assert after_again["prefill_tokens_total"] == after_first["prefill_tokens_total"], (after_first, after_again)
    assert light.status_code == 200, light.text  # a small grammar samples on the step: no bound applies


def test_a_greedy_grammar_checked_after_the_pick_picks_what_the_grammar_first_chain_picks(smollm2_path: Path) -> None:
    """`Sampler` checks the chain's pick against the grammar and masks only when it is refused; greedy, the
    tokens must be those of llama.cpp's grammar-first chain (the grammar masks every candidate, then argmax)."""
    from backends.llamacpp.worker.native import ContextOptions, Model, lib
    from backends.llamacpp.worker.sampler import Sampler
    from backends.llamacpp.worker.sampling import SamplingParams

    model = Model(smollm2_path, ContextOptions(n_ctx_per_seq=512, n_seq_max=1, n_threads=2, cache_type="bf16"))
    grammar = schema_grammar(enum_schema(50))
    checked_after = Sampler(model, SamplingParams(temperature=0, grammar=grammar))
    first = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    lib.llama_sampler_chain_add(first, lib.llama_sampler_init_grammar(model.vocab, grammar.encode(), b"root"))
    lib.llama_sampler_chain_add(first, lib.llama_sampler_init_greedy())
    rng = np.random.default_rng(3)
    masked = 0
    try:
        for step in range(24):
            logits = rng.normal(size=model.n_vocab).astype(np.float32)
            if step % 2:  # every other step the best token is one the grammar allows (no masking needed)
                logits[grammar_first_best(model, first, logits)] += 100.0
            expected = pick_grammar_first(first, logits)
            got = checked_after.sample_row(logits)
            assert got == expected, (step, got, expected)
            masked += int(np.argmax(logits)) != got
    finally:
        checked_after.close()
        lib.llama_sampler_free(first)
        model.close()
    assert masked >= 6  # both paths taken: the pick refused (masked) and the pick allowed


def grammar_first_pick(chain: Any, logits: np.ndarray[Any, Any]) -> int:
    """The token llama.cpp's own chain `chain` (grammar, then greedy) selects from `logits`, not accepted."""
    from backends.llamacpp.worker.native import lib

    data = (lib.llama_token_data * len(logits))()
    for i, logit in enumerate(logits.tolist()):
        data[i].id, data[i].logit, data[i].p = i, logit, 0.0
    array = lib.llama_token_data_array(data, len(logits), -1, False)
    lib.llama_sampler_apply(chain, ctypes.byref(array))
    return int(array.data[array.selected].id)


def pick_grammar_first(chain: Any, logits: np.ndarray[Any, Any]) -> int:
    from backends.llamacpp.worker.native import lib

    token = grammar_first_pick(chain, logits)
    lib.llama_sampler_accept(chain, token)
    return token


def grammar_first_best(model: Any, chain: Any, logits: np.ndarray[Any, Any]) -> int:
    """The token the grammar-first chain would pick now, without accepting it (a clone of the chain decides)."""
    from backends.llamacpp.worker.native import lib

    clone = lib.llama_sampler_clone(chain)
    try:
        return grammar_first_pick(clone, logits)
    finally:
        lib.llama_sampler_free(clone)
