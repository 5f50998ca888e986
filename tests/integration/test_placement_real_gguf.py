"""Estimate vs reality on the real SmolLM2-135M GGUF: the weights term is what llama.cpp loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import Config
from gateway.placement import inventory_from_spec, plan_models
from gateway.placement.inspection import inspect_gguf

pytestmark = pytest.mark.integration


def test_weights_term_matches_llama_cpp_model_size(smollm2_path: Path) -> None:
    llama_cpp = pytest.importorskip("llama_cpp")
    model = {"name": "smol", "sources": [{"gguf": str(smollm2_path)}], "context": 2048, "concurrency": 4}
    config = Config.model_validate({"gpus": "none", "models": [model]})
    decision = plan_models(config, inventory_from_spec("none")).decision("smol")
    assert decision.plan is not None and decision.estimate is not None
    estimated = decision.estimate.weights_bytes

    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(smollm2_path).encode(), params)
    assert model, "llama.cpp could not load the GGUF"
    try:
        loaded = llama_cpp.llama_model_size(model)  # what it logs as "model size" / CPU model buffer
        n_params = llama_cpp.llama_model_n_params(model)
    finally:
        llama_cpp.llama_model_free(model)
    assert abs(estimated - loaded) / loaded <= 0.05, (estimated, loaded)
    assert inspect_gguf(smollm2_path).n_params == n_params
