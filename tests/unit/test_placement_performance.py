"""The speed model: it reproduces what the GPU machine measured (its calibration, read from the committed
result files) and predicts the published V100 numbers it was not fitted to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from backends.base import DeploymentPlan, EngineName
from gateway.placement.inspection import SourceInfo, inspect_gguf, inspect_hf_dir
from gateway.placement.performance import (
    PROMPT_TOKENS,
    STEP_COSTS,
    GPUSpec,
    Prediction,
    Workload,
    gpu_spec,
    predict,
    step_seconds,
    workload_for,
)
from tests.unit.placement_models import LLAMA2_7B, MIXTRAL_8X7B, write_gguf, write_hf_model

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-11-29-gpu-h200"
H200, V100 = gpu_spec("NVIDIA H200"), gpu_spec("Tesla V100-SXM2-32GB")


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, SourceInfo]:
    root = tmp_path_factory.mktemp("perf")
    out = {"hf": inspect_hf_dir(write_hf_model(root / "7b", LLAMA2_7B))}
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        out[quant] = inspect_gguf(write_gguf(root / f"7b.{quant}.gguf", LLAMA2_7B, quant))
    return out


def plan_for(source: SourceInfo, **fields: Any) -> DeploymentPlan:
    engine = EngineName.LMDEPLOY if source.format == "hf" else EngineName.LLAMACPP
    base: dict[str, Any] = {"n_gpu_layers": -1, "gpu_indices": (0,), "quant": source.quant}
    return DeploymentPlan(model="m", engine=engine, source_path=source.path, model_format=source.format,
                          context_tokens=4096, **{**base, **fields})  # fmt: skip


def tpot_s(path: str, concurrency: int) -> tuple[float, dict[str, Any]]:
    """The measured time per output token (p50) at one concurrency, and the load's spec."""
    data = json.loads((RESULTS / path).read_text())
    level = next(lv for lv in data["levels"] if lv["concurrency"] == concurrency)
    return level["summary"]["tpot_ms"]["p50"] / 1e3, data["spec"]


# --- calibration: the H200 (bench/results/2026-11-29-gpu-h200) ------------------------------------------------


@pytest.mark.parametrize("quant", ["F16", "Q8_0", "Q4_K_M"])
def test_llamacpp_one_stream_on_the_h200_is_reproduced(sources: dict[str, SourceInfo], quant: str) -> None:
    rows = [json.loads(line) for line in (RESULTS / "llamacpp" / "llamacpp_batch1.jsonl").read_text().splitlines()]
    row = next(r for r in rows if r["gguf"] == f"7b-{quant.lower()}.gguf")
    work = workload_for(plan_for(sources[quant]), sources[quant])
    context = row["prompt_tokens"] + row["gen_tokens"] // 2
    assert 1 / step_seconds(work, H200, 1, context) == pytest.approx(row["decode_tok_s"], rel=0.03)


@pytest.mark.parametrize(
    ("path", "quant", "concurrency", "prompt_tokens"),
    [
        ("batching-after/batching_f16_slots16.json", "F16", 16, 110),
        ("batching-after/batching_q8_0_slots16.json", "Q8_0", 16, 110),
        ("batching-after/batching_q8_0_slots8.json", "Q8_0", 8, 110),
        ("turbomind/loadgen_v100-32gb.json", "hf", 1, 224),
        ("turbomind/loadgen_v100-32gb.json", "hf", 32, 224),
    ],
)
def test_batched_decode_on_the_h200_is_reproduced(
    sources: dict[str, SourceInfo], path: str, quant: str, concurrency: int, prompt_tokens: int
) -> None:
    measured, spec = tpot_s(path, concurrency)
    work = workload_for(plan_for(sources[quant]), sources[quant])
    context = prompt_tokens + spec["output_tokens"] // 2
    assert step_seconds(work, H200, concurrency, context) == pytest.approx(measured, rel=0.12)


def test_turbomind_tp2_on_two_h200s_is_reproduced(sources: dict[str, SourceInfo]) -> None:
    measured, _ = tpot_s("turbomind/loadgen_2xv100-16gb.json", 1)
    work = workload_for(plan_for(sources["hf"], tp=2, gpu_indices=(0, 1)), sources["hf"])
    assert step_seconds(work, H200, 1, 224 + 128) == pytest.approx(measured, rel=0.03)


# --- calibration: TTFT, and decode at the load's real context, through voltgate (2026-12-01-gpu-h200*/pvm) --------

PVM = {
    "tm-fp16-32gb": ("2026-12-01-gpu-h200", "hf", -1),
    "gguf-f16-32gb": ("2026-12-01-gpu-h200-session5", "F16", -1),
    "gguf-q8_0-32gb": ("2026-12-01-gpu-h200-session5", "Q8_0", -1),
    "gguf-q4_k_m-32gb": ("2026-12-01-gpu-h200-session5", "Q4_K_M", -1),
    "q4_k_m-partial22-16gb": ("2026-12-01-gpu-h200-session5", "Q4_K_M", 22),
}


def within_25pct(measured: float, predicted: float) -> bool:
    """The issue's goal, as the predict-vs-measure table states it: measured / predicted within 1 +- 0.25."""
    return abs(measured / predicted - 1) <= 0.25


VALIDATION = "2026-12-01-gpu-h200-session5/validation"
"""Call 3 of session 5: every scenario again with ~450-token prompts, run after the calibration above."""


def pvm_rows(scenario: str, folder: str | None = None) -> tuple[list[dict[str, Any]], int]:
    """The measured rows of one predict-vs-measure scenario, and its output tokens per request."""
    path = RESULTS.parent / (folder or PVM[scenario][0]) / "pvm" / "predict_vs_measure.json"
    data = json.loads(path.read_text())
    found = next(s for s in data["scenarios"] if s["name"] == scenario and s.get("rows"))
    return found["rows"], int(found["output_tokens"])


@pytest.mark.parametrize("scenario", list(PVM))
def test_ttft_on_the_h200_is_reproduced_alone_and_bounded_by_the_burst(
    sources: dict[str, SourceInfo], scenario: str
) -> None:
    """One stream: TTFT = overhead + the prompt's prefill, at both prompt lengths measured (~227 tokens, and ~450
    in the validation run). More streams: the closed loop's first wave sends its prompts together and later
    requests arrive spread out, so the p50 lies between the idle TTFT and the burst (all the wave's prefills)."""
    _, quant, layers = PVM[scenario]
    work = workload_for(plan_for(sources[quant], n_gpu_layers=layers), sources[quant])
    prediction = predict(work, H200, context=1024, sessions=1, capacity=1)
    for row in pvm_rows(scenario)[0] + pvm_rows(scenario, VALIDATION)[0]:
        prompt, measured = round(row["prompt_tokens_mean"]), row["ttft_ms"]["measured"] / 1e3
        if row["level"] == 1:
            assert within_25pct(measured, prediction.ttft_at(prompt)), row
        else:
            assert prediction.ttft_at(prompt) < measured <= 1.25 * prediction.ttft_at(prompt, ahead=row["level"] - 1)


@pytest.mark.parametrize("scenario", list(PVM))
def test_decode_at_the_loads_own_context_on_the_h200_is_reproduced(
    sources: dict[str, SourceInfo], scenario: str
) -> None:
    """Per-stream decode at each level, with sessions as long as the load's (prompt + half the output), in the
    calibration run and in the validation run."""
    _, quant, layers = PVM[scenario]
    work = workload_for(plan_for(sources[quant], n_gpu_layers=layers), sources[quant])
    prediction = predict(work, H200, context=1024, sessions=1, capacity=1)
    for rows, output_tokens in (pvm_rows(scenario), pvm_rows(scenario, VALIDATION)):
        for row in rows:
            context = round(row["prompt_tokens_mean"]) + output_tokens // 2
            predicted = prediction.per_stream_at(row["level"], context)
            assert within_25pct(row["per_stream_tok_s"]["measured"], predicted), row


def test_a_prediction_read_back_from_json_recomputes_its_own_numbers(sources: dict[str, SourceInfo]) -> None:
    work = workload_for(plan_for(sources["Q4_K_M"], n_gpu_layers=22), sources["Q4_K_M"])
    prediction = predict(work, V100, context=4096, sessions=8, capacity=8)
    back = Prediction.model_validate_json(prediction.model_dump_json())
    assert back == prediction
    assert back.per_stream_at(8, 4096) == pytest.approx(prediction.decode_tok_s_per_stream, rel=1e-2)
    assert back.ttft_at(PROMPT_TOKENS) == pytest.approx(prediction.ttft_s, abs=1e-3)
    assert back.ttft_at(PROMPT_TOKENS, ahead=7) == pytest.approx(prediction.ttft_burst_s, abs=1e-3)
    explained = back.inputs.explain()
    assert "V100 SXM2 900 GB/s" in explained and "on the CPU (8 threads)" in explained
    assert "the quant's measured ceiling" not in explained  # a V100 stays below the H200's MMQ ceiling


def test_quantised_prefill_on_the_h200_is_capped_by_its_kernels_not_its_tensor_cores(
    sources: dict[str, SourceInfo],
) -> None:
    f16, q8 = (workload_for(plan_for(sources[q]), sources[q]) for q in ("F16", "Q8_0"))
    fast, slow = (predict(w, H200, context=1024, sessions=1, capacity=1) for w in (f16, q8))
    assert slow.prefill_tok_s < 0.6 * fast.prefill_tok_s
    assert "166 TFLOPS (the quant's measured ceiling)" in slow.inputs.explain()


# --- the check: published V100 numbers the model was not fitted to -------------------------------------------


def q4_0_7b() -> Workload:
    """Llama-2-7B Q4_0 as llama-bench reports it: 3.56 GiB, 6.74 B params, 32 layers."""
    size = 3.56 * (1 << 30)
    return Workload("llamacpp", STEP_COSTS["llamacpp-quant"], 32, size, 32 * 2 * 4096 * 2, 6.74e9 * 0.98)


def test_v100_q4_0_decode_matches_the_published_scoreboard() -> None:
    """ggml-org/llama.cpp discussion #15013: V100-SXM2-32GB, Llama-2-7B Q4_0, tg128 = 129-135 t/s."""
    tg128 = predict(q4_0_7b(), V100, context=64, sessions=1, capacity=1).decode_tok_s_1
    assert 120 <= tg128 <= 145


def test_v100_prefill_matches_the_published_pp512() -> None:
    """The same scoreboard: pp512 = 3,040 t/s (PREFILL_MFU was set from it: this pins, it does not check)."""
    assert predict(q4_0_7b(), V100, context=512, sessions=1, capacity=1).prefill_tok_s == pytest.approx(3040, rel=0.1)


def test_on_a_v100_one_user_decodes_faster_on_llamacpp_q4_and_q8_than_fp16_can(
    sources: dict[str, SourceInfo],
) -> None:
    """FP16 is bound by 900 GB/s / 13.5 GB = 67 tok/s; the ggml CI's V100-PCIe (2023) measured F16 50.6,
    Q8_0 60.3, Q4_0 89.8 t/s: the same order."""
    speed = {
        name: predict(workload_for(plan_for(sources[name]), sources[name]), V100, context=640, sessions=1, capacity=1)
        for name in ("hf", "F16", "Q8_0", "Q4_K_M")
    }
    assert speed["hf"].decode_tok_s_1 < 67 and speed["F16"].decode_tok_s_1 < 67
    assert speed["F16"].decode_tok_s_1 == pytest.approx(50.6, rel=0.15)
    assert speed["Q4_K_M"].decode_tok_s_1 > speed["Q8_0"].decode_tok_s_1 > speed["hf"].decode_tok_s_1


def test_on_a_v100_turbomind_fp16_wins_once_many_users_share_it(sources: dict[str, SourceInfo]) -> None:
    tm = workload_for(plan_for(sources["hf"]), sources["hf"])
    q8 = workload_for(plan_for(sources["Q8_0"]), sources["Q8_0"])
    many_tm = predict(tm, V100, context=512, sessions=32, capacity=32).aggregate_tok_s
    many_q8 = predict(q8, V100, context=512, sessions=16, capacity=16).aggregate_tok_s
    assert many_tm > 1.3 * many_q8


def test_partial_offload_is_predicted_many_times_slower(sources: dict[str, SourceInfo]) -> None:
    source = sources["Q4_K_M"]
    full = predict(workload_for(plan_for(source), source), V100, context=4096, sessions=8, capacity=8)
    partial = predict(workload_for(plan_for(source, n_gpu_layers=22), source), V100, context=4096, sessions=8,
                      capacity=8)  # fmt: skip
    assert partial.aggregate_tok_s * 4 < full.aggregate_tok_s
    assert any("read from host memory every token" in note for note in partial.notes)


# --- the GPU table ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "row", "bandwidth_gbs"),
    [
        ("Tesla V100-SXM2-16GB", "V100 SXM2", 900),
        ("Tesla V100-PCIE-32GB", "V100 PCIe", 900),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe", 1134),
        ("Tesla T4", "T4", 320),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1555),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 1935),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM", 2039),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 3350),
        ("NVIDIA H100 PCIe", "H100 PCIe", 2000),
        ("NVIDIA H200", "H200", 4800),
        ("NVIDIA GeForce RTX 3090", "RTX 3090", 936),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 1008),
        ("a10", "A10", 600),
    ],
)
def test_gpu_table_lookup_by_nvml_name(name: str, row: str, bandwidth_gbs: int) -> None:
    spec = gpu_spec(name)
    assert (spec.name, spec.bandwidth_bytes_s, spec.known) == (row, bandwidth_gbs * 1e9, True)


def test_an_unknown_gpu_is_predicted_as_a_v100_and_says_so() -> None:
    spec = gpu_spec("Quantum Accelerator 9000")
    assert not spec.known and "predicted as a V100 SXM2" in spec.name
    assert isinstance(spec, GPUSpec) and spec.bandwidth_bytes_s == 900e9


def test_a_turbomind_moe_step_reads_the_experts_its_tokens_route_to(tmp_path: Path) -> None:
    """Mixtral FP16 on TurboMind: a token reads 2 of 8 experts, so one stream decodes faster than the same
    bytes read whole; a step of 32 tokens reads nearly every expert, so the gain is gone there."""
    moe = inspect_hf_dir(write_hf_model(tmp_path / "mixtral", MIXTRAL_8X7B))
    plan = plan_for(moe, tp=2, gpu_indices=(0, 1))
    routed, whole = workload_for(plan, moe), workload_for(plan, moe.model_copy(update={"layer_expert_bytes": ()}))
    assert routed.expert_share == 0.25 and whole.expert_share == 1.0
    assert routed.gpu_expert_bytes == sum(moe.layer_expert_bytes) / 2
    one, one_whole = (predict(w, V100, context=512, sessions=1, capacity=1).decode_tok_s_1 for w in (routed, whole))
    assert one > 2 * one_whole
    many, many_whole = (
        predict(w, V100, context=512, sessions=32, capacity=32).aggregate_tok_s for w in (routed, whole)
    )
    assert many == pytest.approx(many_whole, rel=0.01)  # 32 tokens miss an expert with p = 0.75^32: all are read
