"""A mixture of experts on V100s (issue 39): inspection of the experts, the experts-in-host-memory rung, and its
prediction against layer-wise offload.

Qwen3-30B-A3B's real tensor layout as a header-only Q4_K_M GGUF (`tests.unit.placement_models`): 48 blocks,
128 routed experts of which 8 are active, ~17 GiB. On a V100-32GB it fits whole; on a V100-16GB the plan keeps
every block on the GPU and the routed experts of the fewest blocks in host memory, because a token reads 8 of
128 experts there, where layer-wise offload leaves whole blocks, attention and KV included, to the CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import Config
from gateway.placement import plan_models
from gateway.placement.estimate import MARGIN_BYTES, LlamaCppFit, fit_llamacpp
from gateway.placement.experts import LC_EXPERTS
from gateway.placement.inspection import inspect_gguf
from gateway.placement.inventory import inventory_from_spec
from gateway.placement.performance import workload_for
from gateway.placement.report import PlacementReport
from gateway.placement.rungs import TM_FP16, TM_MOE_SM90, TM_MOE_UNVERIFIED, TM_W4A16
from tests.unit.placement_models import AWQ_GEMM, LLAMA2_7B, MIXTRAL_8X7B, build_zoo, write_hf_model
from tests.unit.test_placement_policy import assert_not_overcommitted

GGUF = "qwen3-30b-a3b.Q4_K_M.gguf"
HOST_64GB = 64 << 30


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def plan(zoo: Path, gpus: str, host_bytes: int | None = HOST_64GB, **model: object) -> PlacementReport:
    entry = {"name": "qwen3-moe", "sources": [{"gguf": GGUF}], "context": 8192, "concurrency": 2, **model}
    config = Config.model_validate({"gpus": gpus, "models": [entry], "base_dir": zoo})
    inventory = inventory_from_spec(gpus).model_copy(update={"host_memory_bytes": host_bytes})
    report = plan_models(config, inventory)
    assert_not_overcommitted(report)
    return report


def test_the_experts_are_read_per_block(zoo: Path) -> None:
    info = inspect_gguf(zoo / GGUF)
    assert (info.shape.n_experts, info.shape.n_experts_used) == (128, 8)
    assert len(info.layer_expert_bytes) == 48
    share = sum(info.layer_expert_bytes) / sum(info.layer_bytes)
    assert 0.9 < share < 1.0  # the routed experts are nearly all of a block's bytes


def test_whole_on_a_32gb_v100(zoo: Path) -> None:
    decision = plan(zoo, "v100-32gb").decision("qwen3-moe")
    assert decision.rung == "llamacpp-gpu" and decision.plan is not None
    assert decision.plan.n_cpu_moe == 0 and decision.plan.n_gpu_layers == -1


def test_experts_in_host_memory_when_it_does_not_fit_whole(zoo: Path) -> None:
    decision = plan(zoo, "v100-16gb").decision("qwen3-moe")
    assert decision.rung == LC_EXPERTS, (decision.rejected, decision.refusal)
    chosen = decision.plan
    assert chosen is not None and chosen.n_gpu_layers == -1 and 0 < chosen.n_cpu_moe < 48
    assert any("routed experts of" in note and "in host memory" in note for note in decision.notes), decision.notes
    assert decision.prediction is not None and decision.prediction.decode_tok_s_1 > 0
    assert any(r.rung == "llamacpp-partial" and "predicted" in r.reason for r in decision.rejected), [
        (r.rung, r.reason) for r in decision.rejected
    ]
    # the fewest blocks: one block fewer does not fit the same card with the same (f16) KV
    info, budget = inspect_gguf(zoo / GGUF), {0: inventory_from_spec("v100-16gb").gpus[0].free_bytes - MARGIN_BYTES}
    for n, fits in ((chosen.n_cpu_moe, True), (chosen.n_cpu_moe - 1, False)):
        fit = fit_llamacpp(info, budgets=budget, n_ctx_total=2 * 8192, n_batch=512, n_offload=49, n_cpu_moe=n,
                           sequences=2)  # fmt: skip
        assert isinstance(fit, LlamaCppFit) is fits, (n, fit)


def test_two_16gb_cards_hold_it_whole(zoo: Path) -> None:
    assert plan(zoo, "2xv100-16gb").decision("qwen3-moe").rung == "llamacpp-gpu"


def test_host_experts_predicted_faster_than_layer_offload_and_both_below_whole(zoo: Path) -> None:
    info = inspect_gguf(zoo / GGUF)
    experts = plan(zoo, "v100-16gb").decision("qwen3-moe")
    assert experts.plan is not None and experts.prediction is not None
    layers = experts.plan.model_copy(update={"n_cpu_moe": 0, "n_gpu_layers": 24})  # half the blocks instead
    work_experts, work_layers = workload_for(experts.plan, info), workload_for(layers, info)
    # per token the host reads the active experts' share of its experts only
    assert work_experts.host_expert_bytes > 0 and work_experts.expert_share == 8 / 128
    assert work_layers.host_weight_bytes > work_experts.host_weight_bytes * 0.4
    whole = plan(zoo, "v100-32gb").decision("qwen3-moe").prediction
    assert whole is not None and experts.prediction.decode_tok_s_1 < whole.decode_tok_s_1


def test_a_pinned_split_is_honoured_and_counted(zoo: Path) -> None:
    decision = plan(zoo, "v100-32gb", llamacpp={"n_cpu_moe": 10}).decision("qwen3-moe")
    assert decision.rung == "llamacpp-gpu" and decision.plan is not None and decision.plan.n_cpu_moe == 10
    whole = plan(zoo, "v100-32gb").decision("qwen3-moe")
    assert decision.estimate is not None and whole.estimate is not None
    assert sum(decision.estimate.gpu_bytes.values()) < sum(whole.estimate.gpu_bytes.values())


def test_a_pinned_layer_count_is_layer_offload_not_experts_in_host_memory(zoo: Path) -> None:
    decision = plan(zoo, "v100-16gb", llamacpp={"n_gpu_layers": 30}).decision("qwen3-moe")
    assert decision.rung == "llamacpp-partial" and decision.plan is not None, decision
    assert (decision.plan.n_gpu_layers, decision.plan.n_cpu_moe) == (30, 0)
    assert not any(r.rung == LC_EXPERTS for r in decision.rejected)  # the pin asked for layers: not compared


def test_a_dense_model_never_gets_the_rung(zoo: Path) -> None:
    config = Config.model_validate({"gpus": "v100-16gb", "models": [{"name": "big", "sources": [
        {"gguf": "llama2-70b.Q4_K_M.gguf"}]}], "base_dir": zoo})  # fmt: skip
    decision = plan_models(config, inventory_from_spec("v100-16gb")).decision("big")
    assert decision.rung == "llamacpp-partial"
    assert not any(r.rung == LC_EXPERTS for r in decision.rejected)  # not even tried


@pytest.mark.parametrize(("config", "warned"), [({**MIXTRAL_8X7B, "num_hidden_layers": 8}, True), (LLAMA2_7B, False)])
def test_a_fp16_moe_on_turbomind_is_planned_with_a_warning(
    tmp_path: Path, config: dict[str, object], warned: bool
) -> None:
    """Its grouped FP16 GEMM was not loaded on a V100 (LMDeploy 0.18 has none for the GPU machine's sm_90): the plan
    says so, and how to serve it otherwise; a dense model gets no such warning."""
    write_hf_model(tmp_path / "m", config)
    entry = {"name": "m", "sources": [{"hf": "m"}], "context": 4096, "concurrency": 2}
    config_ = Config.model_validate({"gpus": "v100-32gb", "models": [entry], "base_dir": tmp_path})
    decision = plan_models(config_, inventory_from_spec("v100-32gb")).decision("m")
    assert decision.rung == TM_FP16
    assert (TM_MOE_UNVERIFIED in decision.warnings) is warned


@pytest.mark.parametrize(("extra_args", "warning"), [((), TM_MOE_SM90), (("--dtype", "bfloat16"), TM_MOE_UNVERIFIED),
                                                   (("--dtype=bfloat16",), TM_MOE_UNVERIFIED)])  # fmt: skip
def test_a_fp16_moe_on_an_sm90_gpu_is_told_it_will_not_start_unless_served_as_bf16(
    tmp_path: Path, extra_args: tuple[str, ...], warning: str
) -> None:
    """LMDeploy 0.18 has no grouped FP16 GEMM on sm_90 (bench/results/2026-12-06-tm-moe-h100/); as BF16 it served
    (bench/results/2026-12-07-gpu-h100-hybrid-moe-8b/)."""
    write_hf_model(tmp_path / "m", {**MIXTRAL_8X7B, "num_hidden_layers": 8})
    entry = {"name": "m", "sources": [{"hf": "m"}], "context": 4096, "concurrency": 2,
             "lmdeploy": {"extra_args": list(extra_args)}}  # fmt: skip
    config = Config.model_validate({"models": [entry], "base_dir": tmp_path})
    decision = plan_models(config, inventory_from_spec("h100:80:9.0")).decision("m")
    assert decision.rung == TM_FP16, decision
    assert warning in decision.warnings and ({TM_MOE_SM90, TM_MOE_UNVERIFIED} - {warning}).isdisjoint(decision.warnings)


def test_an_awq_moe_on_turbomind_gets_w4a16_and_no_fp16_warning(tmp_path: Path) -> None:
    """The warning is about TurboMind's grouped FP16 GEMM; an AWQ MoE's experts run its int4 kernels, which the
    dense W4A16 models use too, so its plan carries no such warning (and its experts are counted, as 4-bit)."""
    write_hf_model(tmp_path / "m", {**MIXTRAL_8X7B, "num_hidden_layers": 8}, quant=AWQ_GEMM)
    entry = {"name": "m", "sources": [{"hf": "m", "format": "awq"}], "context": 4096, "concurrency": 2}
    config = Config.model_validate({"gpus": "v100-32gb", "models": [entry], "base_dir": tmp_path})
    decision = plan_models(config, inventory_from_spec("v100-32gb")).decision("m")
    assert decision.rung == TM_W4A16 and decision.plan is not None and decision.plan.quant == "awq", decision
    assert TM_MOE_UNVERIFIED not in decision.warnings
