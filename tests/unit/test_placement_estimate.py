"""The memory estimates reproduce what was measured on the GPU machine (docs/hardware.md: H200 held to a V100)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.placement.estimate import (
    TM_FIXED_BYTES_TP,
    TM_FIXED_BYTES_TP1,
    LlamaCppFit,
    Shortfall,
    TurboMindFit,
    fit_llamacpp,
    fit_turbomind,
    turbomind_runtime_bytes,
)
from gateway.placement.inspection import SourceInfo, inspect_gguf, inspect_hf_dir
from tests.unit.placement_models import LLAMA2_7B, LLAMA2_13B, write_gguf, write_hf_model

MIB = 1 << 20
V100_16GB = 16_160 * MIB
V100_32GB = 32_510 * MIB


@pytest.fixture(scope="module")
def llama7b(tmp_path_factory: pytest.TempPathFactory) -> SourceInfo:
    return inspect_hf_dir(write_hf_model(tmp_path_factory.mktemp("m") / "7b", LLAMA2_7B))


@pytest.fixture(scope="module")
def llama13b(tmp_path_factory: pytest.TempPathFactory) -> SourceInfo:
    return inspect_hf_dir(write_hf_model(tmp_path_factory.mktemp("m") / "13b", LLAMA2_13B, shards=3))


# --- TurboMind: lmdeploy 0.18, random-weight Llama-2 shapes ---------------------------------------------


def test_turbomind_memory_free_after_weights_matches_measured(llama7b: SourceInfo, llama13b: SourceInfo) -> None:
    # 32 GB card: 18,694 MiB free after the 7B's weights; two 16 GB cards at tp 2: 2,498 MiB per GPU.
    after_7b = (V100_32GB - llama7b.weights_bytes - TM_FIXED_BYTES_TP1) / MIB
    after_13b = (V100_16GB - llama13b.weights_bytes / 2 - TM_FIXED_BYTES_TP) / MIB
    assert after_7b == pytest.approx(18_694, abs=10)
    assert after_13b == pytest.approx(2_498, abs=10)


def test_turbomind_7b_on_32gb_at_ratio_08_gets_the_measured_kv_cache(llama7b: SourceInfo) -> None:
    fit = fit_turbomind(llama7b, gpu_indices=(0,), free_bytes=V100_32GB, session_len=4096, concurrency=1,
                        extra_kv=True)  # fmt: skip
    assert isinstance(fit, TurboMindFit)
    assert fit.cache_max_entry_count == 0.8
    assert fit.estimate.kv_cache_bytes / MIB == pytest.approx(14_955, abs=10)  # "Object cache budget"
    assert fit.sessions_in_cache == 7 and fit.max_batch_size == 7


def test_turbomind_7b_fp16_4096_does_not_fit_a_16gb_card(llama7b: SourceInfo) -> None:
    """Measured: 2,344 MiB free after the weights, one 4,096-token session needs 2 GiB of KV, and the
    runtime buffers need more than ratio 0.8 leaves: the worker aborts or never becomes ready."""
    fit = fit_turbomind(llama7b, gpu_indices=(0,), free_bytes=V100_16GB, session_len=4096, concurrency=1)
    assert isinstance(fit, Shortfall)
    assert 1.0 < fit.gib < 2.0
    # what ratio 0.8 leaves (469 MiB) is less than the runtime buffers at the default batch of 128
    assert turbomind_runtime_bytes(llama7b.shape, 4096, 128, 8192, 1) > 0.2 * 2_344 * MIB


def test_turbomind_13b_tp2_on_16gb_cards_serves_2048_not_4096(llama13b: SourceInfo) -> None:
    """Measured at ratio 0.8 / max batch 64: session 4096 aborts, 2048 serves."""
    kv_budget_rest = 0.2 * 2_498 * MIB
    assert turbomind_runtime_bytes(llama13b.shape, 4096, 64, 8192, 2) > kv_budget_rest
    assert turbomind_runtime_bytes(llama13b.shape, 2048, 64, 8192, 2) < kv_budget_rest
    short = fit_turbomind(llama13b, gpu_indices=(0, 1), free_bytes=V100_16GB, session_len=4096, concurrency=1)
    assert isinstance(short, Shortfall)
    fit = fit_turbomind(llama13b, gpu_indices=(0, 1), free_bytes=V100_16GB, session_len=2048, concurrency=1)
    assert isinstance(fit, TurboMindFit)
    assert fit.estimate.kv_cache_bytes / 2 >= 2048 * 400 * 1024  # 400 KiB/token per GPU
    assert set(fit.estimate.gpu_bytes) == {0, 1}


def test_turbomind_kv_int8_halves_the_kv_term(llama7b: SourceInfo) -> None:
    fp16 = fit_turbomind(llama7b, gpu_indices=(0,), free_bytes=V100_32GB, session_len=4096, concurrency=4)
    int8 = fit_turbomind(llama7b, gpu_indices=(0,), free_bytes=V100_32GB, session_len=4096, concurrency=4,
                         quant_policy=8)  # fmt: skip
    assert isinstance(fp16, TurboMindFit) and isinstance(int8, TurboMindFit)
    assert int8.estimate.kv_cache_bytes == pytest.approx(fp16.estimate.kv_cache_bytes * (1 + 4 / 128) / 2, rel=0.01)


def test_turbomind_forced_cache_ratio_is_checked(llama7b: SourceInfo) -> None:
    too_small = fit_turbomind(llama7b, gpu_indices=(0,), free_bytes=V100_32GB, session_len=4096, concurrency=4,
                              cache_ratio=0.3)  # fmt: skip
    assert isinstance(too_small, Shortfall) and "cache_max_entry_count 0.3" in too_small.why
    assert too_small.gib == pytest.approx(8 - 0.3 * 18_697 / 1024, abs=0.01)  # 8 GiB of KV wanted
    fits = fit_turbomind(llama7b, gpu_indices=(0,), free_bytes=V100_32GB, session_len=4096, concurrency=4,
                         cache_ratio=0.5)  # fmt: skip
    assert isinstance(fits, TurboMindFit) and fits.cache_max_entry_count == 0.5


# --- llama.cpp: llama-cpp-python 0.3.36, CUDA, flash attention, n_batch 512 -----------------------------

MEASURED_LLAMACPP = [
    # GGUF, n_gpu_layers (33 = all + output head), n_ctx, GPU MiB measured (docs/hardware.md)
    ("F16", 33, 4096, 15_449),
    ("F16", 33, 16_384, 21_605),
    ("F16", 16, 4096, 7_861),
    ("Q8_0", 33, 4096, 9_443),
    ("Q8_0", 33, 16_384, 15_599),
    ("Q8_0", 16, 4096, 4_897),
    ("Q4_K_M", 33, 4096, 6_569),
    ("Q4_K_M", 33, 16_384, 12_725),
    ("Q4_K_M", 16, 4096, 3_529),
]


@pytest.mark.parametrize(("quant", "layers", "n_ctx", "measured_mib"), MEASURED_LLAMACPP)
def test_llamacpp_gpu_estimate_is_at_or_just_above_measured(
    tmp_path: Path, quant: str, layers: int, n_ctx: int, measured_mib: int
) -> None:
    source = inspect_gguf(write_gguf(tmp_path / f"7b.{quant}.gguf", LLAMA2_7B, quant))
    fit = fit_llamacpp(source, budgets={0: 100 << 30}, n_ctx_total=n_ctx, n_batch=512, n_offload=layers)
    assert isinstance(fit, LlamaCppFit)
    estimated_mib = fit.estimate.gpu_bytes[0] / MIB
    assert 0 <= (estimated_mib - measured_mib) / measured_mib <= 0.05


def test_llamacpp_kv_is_exactly_layers_heads_dim_ctx(tmp_path: Path) -> None:
    source = inspect_gguf(write_gguf(tmp_path / "7b.gguf", LLAMA2_7B, "Q8_0"))
    fit = fit_llamacpp(source, budgets={0: 100 << 30}, n_ctx_total=4096, n_batch=512, n_offload=33)
    assert isinstance(fit, LlamaCppFit)
    assert fit.estimate.kv_cache_bytes == 2048 * MIB  # 2 x 32 x 32 x 128 x 2 B x 4,096
    assert fit.n_gpu_layers == -1 and fit.layers_per_gpu == {0: 32}
    assert fit.estimate.host_bytes == source.embedding_bytes  # token_embd stays in host memory


def test_llamacpp_layers_split_over_two_gpus_by_room(tmp_path: Path) -> None:
    source = inspect_gguf(write_gguf(tmp_path / "7b.gguf", LLAMA2_7B, "Q8_0"))
    fit = fit_llamacpp(source, budgets={0: 6 << 30, 1: 12 << 30}, n_ctx_total=4096, n_batch=512, n_offload=33)
    assert isinstance(fit, LlamaCppFit)
    assert sum(fit.layers_per_gpu.values()) == 32
    assert fit.layers_per_gpu[0] < fit.layers_per_gpu[1]
    assert all(fit.estimate.gpu_bytes[i] <= b for i, b in {0: 6 << 30, 1: 12 << 30}.items())


def test_llamacpp_cpu_estimate_is_host_only(tmp_path: Path) -> None:
    source = inspect_gguf(write_gguf(tmp_path / "7b.gguf", LLAMA2_7B, "Q4_K_M"))
    fit = fit_llamacpp(source, budgets={}, n_ctx_total=2048, n_batch=512, n_offload=0)
    assert isinstance(fit, LlamaCppFit)
    assert fit.estimate.gpu_bytes == {} and fit.estimate.cuda_context_bytes == 0
    assert fit.estimate.weights_bytes == source.weights_bytes
    assert fit.estimate.host_bytes > source.weights_bytes + fit.estimate.kv_cache_bytes
    assert fit.estimate.terms_gib["weights"] == round(source.weights_bytes / (1 << 30), 2)
