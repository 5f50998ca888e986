"""A hybrid-attention model's cache as the planner predicts it and as the real llama.cpp allocates it (issue 39).

Two tiny random-weight layouts, Granite-4.0-H (`tests.fixtures.tiny_hybrid`: 6 blocks, 2 attending as the
per-layer KV heads say, 4 Mamba2) and Qwen3-Next (`tests.fixtures.tiny_qwen3next`: 8 MoE blocks, every 4th
attending, the others gated delta nets), are each planned by `gateway.placement` and loaded through the
worker's own `native.Model` with the plan's context, slots, KV type and flash attention
(`tests.fixtures.hybrid_alloc`, which `bench/gpu/hybrid_memory.py` runs on CUDA too). llama.cpp logs what it
allocated, `llama_kv_cache: size = X MiB (N cells, L layers, ...)` and `llama_memory_recurrent: size = Y MiB
(...)`, in MiB to two decimals; both must equal the prediction to that rounding: KV for the attention layers
only, and a fixed state per layer and sequence for the others. Then the real worker serves each model over HTTP.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.config import Config
from gateway.placement import inventory_from_spec, plan_models
from gateway.placement.inspection import inspect_gguf
from tests.fixtures.hybrid_alloc import LAYOUTS, LOG_ROUNDING, MIB, Layout, allocated, predicted
from tests.integration.test_llamacpp_worker import MODEL, Worker
from tests.integration.test_prompt_cache_worker import running

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def hybrid(
    request: pytest.FixtureRequest, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Layout]:
    layout = LAYOUTS[request.param]
    return layout.write(smollm2_path, tmp_path_factory.mktemp("hybrid") / f"tiny-{request.param}.gguf"), layout


@pytest.mark.parametrize(("context", "slots"), [(2048, 1), (1024, 4), (512, 8)])
def test_the_predicted_kv_and_recurrent_state_are_what_llama_cpp_allocates(
    hybrid: tuple[Path, Layout], context: int, slots: int
) -> None:
    hybrid_path, layout = hybrid
    model = {"name": "hybrid", "sources": [{"gguf": str(hybrid_path)}], "context": context, "concurrency": slots}
    decision = plan_models(Config.model_validate({"gpus": "none", "models": [model]}), inventory_from_spec("none"))
    plan, estimate = decision.decision("hybrid").plan, decision.decision("hybrid").estimate
    assert plan is not None and estimate is not None and (plan.context_tokens, plan.slots) == (context, slots)
    shape = inspect_gguf(hybrid_path).shape
    assert shape.recurrent_state_bytes == 4 * layout.state_floats_per_layer
    predicted_kv, predicted_state = predicted(hybrid_path, plan)
    assert estimate.kv_cache_bytes == predicted_kv + predicted_state  # the planner's cache term is these two

    kv, rs, _ = allocated(hybrid_path, plan)
    # llama.cpp's own counts: a cell per token per slot, KV in the attention layers only, a state row per slot
    assert (int(kv[2]), int(kv[3]), int(kv[5])) == (context, layout.attention_layers, slots)
    assert (int(rs[2]), int(rs[3])) == (slots, slots)
    assert abs(float(kv[1]) * MIB - predicted_kv) <= LOG_ROUNDING, (kv[0], predicted_kv / MIB)
    assert abs(float(rs[1]) * MIB - predicted_state) <= LOG_ROUNDING, (rs[0], predicted_state / MIB)
    every_layer_kv = predicted_kv * layout.n_layers // layout.attention_layers  # a dense model's sizing: 3-4x
    assert float(kv[1]) * MIB < every_layer_kv - LOG_ROUNDING


def completion(worker: Worker, path: str, body: dict[str, Any]) -> dict[str, Any]:
    body = {"model": MODEL, "max_tokens": 8, "temperature": 0, **body}
    response = httpx.post(f"{worker.url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    reply: dict[str, Any] = response.json()
    assert reply["usage"]["completion_tokens"] >= 1
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")
    return reply


def test_the_worker_serves_the_hybrid_model(hybrid: tuple[Path, Layout], tmp_path: Path) -> None:
    """A chat and a completion at once (two sequences decoded together, each with its own recurrent state);
    then a prompt again after a longer one that shares its prefix: a recurrent state cannot be cut back to a
    shared prefix, and these prompts are too short for a context checkpoint (`checkpoints`, tested in
    test_hybrid_checkpoints.py), so the worker reuses none, and the greedy answer is the cold one."""
    requests = [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Say hi."}]}),
        ("/v1/completions", {"prompt": "Once upon a time"}),
    ]
    prompt = "The quick brown fox jumps over the lazy dog and runs into the forest."
    with running(hybrid[0], tmp_path, "--slots", "2") as worker, ThreadPoolExecutor(2) as pool:
        assert worker.health()["slots"] == 2
        list(pool.map(lambda request: completion(worker, *request), requests))
        replies = [
            completion(worker, "/v1/completions", {"prompt": text}) for text in (prompt, f"{prompt} Then", prompt)
        ]
        assert replies[2]["choices"][0]["text"] == replies[0]["choices"][0]["text"]
        # no checkpoint under --prompt-cache-min-tokens (64 on the CPU): every prompt is prefilled whole
        assert [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies] == [0, 0, 0]
