"""The placement decision guide, as a table: which engine, precision, GPUs and context each model gets.

Model files are header-only copies of real checkpoints (tests/unit/placement_models.py); GPU layouts are
simulated V100s with the free memory measured against in docs/hardware.md (16,160 and 32,510 MiB).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from backends.base import EngineName
from gateway.config import Config, load_config
from gateway.placement import PlacementReport, inventory_from_spec, plan_models
from gateway.placement.estimate import MARGIN_BYTES
from tests.unit.placement_models import build_zoo

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def plan(zoo: Path, gpus: str, *models: dict[str, Any]) -> PlacementReport:
    config = Config.model_validate({"gpus": gpus, "models": list(models), "base_dir": zoo})
    report = plan_models(config, inventory_from_spec(gpus))
    assert_not_overcommitted(report)
    return report


def assert_not_overcommitted(report: PlacementReport) -> None:
    """No GPU holds more than its free memory less the 1 GiB margin, summed over the models on it."""
    for gpu in report.inventory.gpus:
        used = sum(d.estimate.gpu_bytes.get(gpu.index, 0) for d in report.decisions if d.plan and d.estimate)
        assert used <= gpu.free_bytes - MARGIN_BYTES, f"GPU {gpu.index} over-committed"


def hf(path: str) -> dict[str, str]:
    return {"hf": path}


def gguf(path: str) -> dict[str, str]:
    return {"gguf": path}


@dataclass
class Case:
    """One line of the decision guide: a model on a GPU layout, and what the planner must decide."""

    id: str
    gpus: str
    model: dict[str, Any]
    rung: str | None  # None: refused
    expect: dict[str, Any] = field(default_factory=dict)  # DeploymentPlan fields
    warning: str | None = None
    rejected: tuple[str, ...] = ()  # substrings of "rung: reason" lines that must be there
    refusal: str | None = None


GUIDE = [
    Case("llama2-7b fp16 on a V100-32GB: TurboMind FP16, spare memory becomes KV for 7 full sessions",
         "v100-32gb", {"sources": [hf("llama2-7b")]}, "turbomind-fp16",
         {"engine": EngineName.LMDEPLOY, "gpu_indices": (0,), "tp": 1, "context_tokens": 4096, "quant_policy": 0,
          "cache_max_entry_count": 0.8, "max_batch_size": 7, "model_format": "hf", "dtype": "float16"}),
    Case("llama2-13b fp16 on 2xV100-16GB, 2048 tokens: TurboMind tp 2 (measured to serve)",
         "2xv100-16gb", {"sources": [hf("llama2-13b")], "context": 2048}, "turbomind-fp16-tp",
         {"gpu_indices": (0, 1), "tp": 2, "context_tokens": 2048, "quant_policy": 0},
         rejected=("turbomind-fp16: needs 28.",)),
    Case("llama2-13b fp16 on 2xV100-16GB, 4096 tokens, min 2048: tp 2, KV int8, session shortened to 3584",
         "2xv100-16gb", {"sources": [hf("llama2-13b")], "min_context": 2048}, "turbomind-fp16-tp",
         {"tp": 2, "context_tokens": 3584, "quant_policy": 8},
         warning="session shortened from 4096 to 3584 tokens",
         rejected=("turbomind-fp16-tp: tp 2: needs 16.69 GiB",)),
    Case("llama2-13b fp16 on 2xV100-16GB, 4096 tokens, nothing else allowed: refused (measured to abort)",
         "2xv100-16gb", {"sources": [hf("llama2-13b")]}, None,
         refusal="short by 0.2 GiB on the closest option, turbomind-fp16-tp (tp 2: KV int8: needs 15.93 GiB"),
    Case("llama2-70b with only Q4_K_M on one V100-16GB: llama.cpp, 27 of 80 layers on the GPU",
         "v100-16gb", {"sources": [gguf("llama2-70b.Q4_K_M.gguf")]}, "llamacpp-partial",
         {"engine": EngineName.LLAMACPP, "n_gpu_layers": 27, "gpu_indices": (0,), "quant": "Q4_K_M"},
         rejected=("llamacpp-gpu: Q4_K_M: all layers on GPU 0 need 40.55 GiB",)),
    Case("llama2-70b Q8_0 and Q4_K_M on 2xV100-32GB: the highest quant that fits, Q4_K_M, on both GPUs",
         "2xv100-32gb", {"sources": [gguf("llama2-70b.Q8_0.gguf"), gguf("llama2-70b.Q4_K_M.gguf")]},
         "llamacpp-gpu", {"quant": "Q4_K_M", "n_gpu_layers": -1, "gpu_indices": (0, 1), "tp": 1},
         rejected=("llamacpp-gpu: Q8_0: all layers on GPU 0, 1 need 71.04 GiB",)),
    Case("mixtral-8x7b AWQ on a V100-32GB: TurboMind W4A16",
         "v100-32gb", {"sources": [{"hf": "mixtral-8x7b-awq", "format": "awq"}]}, "turbomind-w4a16",
         {"engine": EngineName.LMDEPLOY, "model_format": "awq", "quant": "awq", "tp": 1, "context_tokens": 4096}),
    Case("llama2-7b fp16 4096 on a V100-16GB with F16 and Q8_0 GGUFs: not TurboMind, llama.cpp Q8_0",
         "v100-16gb", {"sources": [hf("llama2-7b"), gguf("llama2-7b.F16.gguf"), gguf("llama2-7b.Q8_0.gguf")]},
         "llamacpp-gpu", {"quant": "Q8_0", "n_gpu_layers": -1, "context_tokens": 4096},
         rejected=("turbomind-fp16: needs 17.37 GiB per GPU", "llamacpp-gpu: F16: all layers on GPU 0 need 15.")),
    Case("llama2-7b fp16 4096 on a V100-16GB, min_context 1024: TurboMind with KV int8 and a 2560 session",
         "v100-16gb", {"sources": [hf("llama2-7b")], "min_context": 1024}, "turbomind-fp16",
         {"context_tokens": 2560, "quant_policy": 8}, warning="session shortened from 4096 to 2560 tokens"),
    Case("llama2-7b fp16 4096 on a V100-16GB, no GGUF, no min_context: refused",
         "v100-16gb", {"sources": [hf("llama2-7b")]}, None, refusal="a GGUF source would let llama.cpp"),
    Case("llama2-7b fp16 2048 on a V100-16GB: KV int8 rescues TurboMind",
         "v100-16gb", {"sources": [hf("llama2-7b")], "context": 2048}, "turbomind-fp16",
         {"context_tokens": 2048, "quant_policy": 8}),
    Case("a bfloat16 checkpoint on a V100: float16, with a warning",
         "v100-32gb", {"sources": [hf("llama2-7b-bf16")]}, "turbomind-fp16", {"dtype": "float16"},
         warning="bfloat16 checkpoint: Volta has no BF16"),
    Case("a bfloat16 checkpoint on a BF16-capable GPU keeps its dtype",
         "a100:80:8.0", {"sources": [hf("llama2-7b-bf16")]}, "turbomind-fp16", {"dtype": "auto"}),
    Case("llama2-70b fp16 only, on a V100-16GB: refused with the shortfall",
         "v100-16gb", {"sources": [hf("llama2-70b")]}, None,
         refusal="fits nowhere: short by 117.3 GiB on the closest option, turbomind-fp16 (KV int8: needs 133.12"),
    Case("no GPUs: llama.cpp on the CPU",
         "none", {"sources": [hf("llama2-7b"), gguf("llama2-7b.Q4_K_M.gguf")], "concurrency": 2}, "llamacpp-cpu",
         {"n_gpu_layers": 0, "gpu_indices": (), "slots": 2, "context_tokens": 4096},
         rejected=("gpu: no GPUs in the inventory",)),
    Case("13B on a 32 GB and a 16 GB card: tp needs identical GPUs; one GPU, the 32 GB one",
         "v100-32gb,v100-16gb", {"sources": [hf("llama2-13b")]}, "turbomind-fp16", {"gpu_indices": (0,), "tp": 1}),
    Case("Mistral-7B as HF only: TurboMind 0.18 does not run MistralForCausalLM (its converter has no entry for it);"
         " refused, saying a GGUF lets llama.cpp run it",
         "v100-32gb", {"sources": [hf("mistral-7b")], "context": 8192, "concurrency": 8}, None,
         refusal="a GGUF source would let llama.cpp run it",
         rejected=("turbomind-fp16: TurboMind (lmdeploy 0.18) does not run MistralForCausalLM",)),
    Case("gpt-oss-20b as HF: TurboMind 0.18 runs it, voltgate does not size it there yet: refused, naming why",
         "v100-32gb", {"sources": [hf("gpt-oss-20b-bf16")]}, None, refusal="a GGUF source would let llama.cpp",
         rejected=("turbomind-fp16: TurboMind (lmdeploy 0.18) runs GptOssForCausalLM, but voltgate does not size",)),
    Case("missing sources: refused with 'source not found', never a crash",
         "v100-16gb", {"sources": [hf("/models/nowhere"), gguf("nowhere.gguf")]}, None,
         refusal="no usable source: /models/nowhere: source not found"),
    Case("one missing source of two: the other is used, the missing one is reported",
         "v100-16gb", {"sources": [hf("/models/nowhere"), gguf("llama2-7b.Q4_K_M.gguf")]}, "llamacpp-gpu",
         {"quant": "Q4_K_M"}, rejected=("source: /models/nowhere: source not found",)),
]  # fmt: skip


@pytest.mark.parametrize("case", GUIDE, ids=[c.id for c in GUIDE])
def test_decision_guide(zoo: Path, case: Case) -> None:
    report = plan(zoo, case.gpus, {"name": "m", **case.model})
    decision = report.decision("m")
    lines = [f"{rung}: {reason}" for rung, reason in decision.rejected]
    if case.rung is None:
        assert decision.plan is None and decision.refusal is not None
        assert case.refusal is not None and case.refusal in decision.refusal
        assert report.plans == []
    else:
        assert decision.plan is not None, decision.refusal
        assert decision.rung == case.rung, lines
        assert decision.refusal is None and decision.estimate is not None
        for name, value in case.expect.items():
            assert getattr(decision.plan, name) == value, name
        assert report.plans == [decision.plan]
    if case.warning:
        assert any(case.warning in w for w in decision.warnings), decision.warnings
    for expected in case.rejected:
        assert any(expected in line for line in lines), (expected, lines)


def test_kv_int8_is_explained(zoo: Path) -> None:
    decision = plan(zoo, "v100-16gb", {"name": "m", "sources": [hf("llama2-7b")], "context": 2048}).decision("m")
    assert any(n.startswith("KV int8 (quant_policy 8): with fp16 KV it is short by") for n in decision.notes)


def test_kv_int8_never_for_head_dim_64(zoo: Path) -> None:
    report = plan(zoo, "v100-16gb", {"name": "m", "sources": [hf("qwen2-0.5b")], "lmdeploy": {"quant_policy": 8}})
    decision = report.decision("m")
    assert decision.plan is None
    assert any("needs head_dim 128, this model has 64" in reason for _, reason in decision.rejected)


# --- several models ---------------------------------------------------------------------------------------


def test_three_models_share_two_gpus_largest_first(zoo: Path) -> None:
    report = plan(
        zoo,
        "2xv100-32gb",
        {"name": "small-q8", "sources": [gguf("llama2-7b.Q8_0.gguf")]},
        {"name": "mid-7b", "sources": [hf("llama2-7b")]},
        {"name": "big-13b", "sources": [hf("llama2-13b")]},
    )
    big, mid, small = (report.decision(n) for n in ("big-13b", "mid-7b", "small-q8"))
    assert report.start_order == ["big-13b", "mid-7b", "small-q8"]
    assert [d.model for d in report.decisions] == ["small-q8", "mid-7b", "big-13b"]  # config order
    assert big.plan and mid.plan and small.plan
    assert big.plan.gpu_indices == (0,) and mid.plan.gpu_indices == (1,) and small.plan.gpu_indices == (1,)
    assert small.plan.engine is EngineName.LLAMACPP and small.plan.n_gpu_layers == -1
    # alone on GPU 0 the 13B gets the spare memory as KV; the 7B shares GPU 1 and keeps to its target
    assert big.plan.cache_max_entry_count and mid.plan.cache_max_entry_count
    assert big.plan.cache_max_entry_count > 0.5 > mid.plan.cache_max_entry_count
    assert any("GPU shared with another model" in w for w in mid.warnings)
    assert [p.model for p in report.plans] == report.start_order


def test_two_models_on_two_16gb_gpus(zoo: Path) -> None:
    report = plan(
        zoo,
        "2xv100-16gb",
        {"name": "chat", "sources": [hf("llama2-7b"), gguf("llama2-7b.Q8_0.gguf")]},
        {"name": "draft", "sources": [gguf("llama2-7b.Q4_K_M.gguf")]},
    )
    chat, draft = report.decision("chat"), report.decision("draft")
    assert chat.plan and chat.rung == "turbomind-fp16-tp" and chat.plan.gpu_indices == (0, 1)
    assert draft.plan and draft.rung == "llamacpp-gpu" and draft.plan.gpu_indices == (0, 1)
    assert report.start_order == ["chat", "draft"]  # TurboMind sizes its cache from what is free at start


def test_partial_offload_takes_what_whole_placements_leave(zoo: Path) -> None:
    """Pass 1 places models wholly on GPUs; only then does the 70B take the rest for partial offload."""
    report = plan(
        zoo,
        "2xv100-16gb",
        {"name": "big", "sources": [gguf("llama2-70b.Q4_K_M.gguf")]},
        {"name": "small", "sources": [gguf("llama2-7b.Q8_0.gguf")]},
    )
    big, small = report.decision("big"), report.decision("small")
    assert small.plan and small.rung == "llamacpp-gpu" and small.plan.n_gpu_layers == -1
    assert big.plan and big.rung == "llamacpp-partial" and 0 < big.plan.n_gpu_layers < 80
    assert report.start_order == ["small", "big"]


def test_a_model_that_no_longer_fits_is_refused_not_overcommitted(zoo: Path) -> None:
    report = plan(
        zoo,
        "v100-32gb",
        {"name": "a", "sources": [hf("llama2-13b")]},
        {"name": "b", "sources": [hf("llama2-7b")], "engine": "lmdeploy"},
    )
    assert report.decision("a").plan is not None
    b = report.decision("b")
    assert b.plan is None and b.refusal and "short by" in b.refusal


# --- overrides --------------------------------------------------------------------------------------------

SEVEN_B = {"name": "m", "sources": [hf("llama2-7b"), gguf("llama2-7b.Q8_0.gguf"), gguf("llama2-7b.Q4_K_M.gguf")]}


@pytest.mark.parametrize(
    ("gpus", "override", "expect", "rejected"),
    [
        # one session: Q4_K_M is predicted >15 % faster than Q8_0, but objective quality (the default, issue 26)
        # keeps Q8_0, which reaches the useful-speed floor; objective speed takes Q4_K_M
        ("v100-32gb", {"engine": "llamacpp"}, {"engine": EngineName.LLAMACPP, "quant": "Q8_0"},
         "turbomind: engine: llamacpp in the config"),
        ("v100-32gb", {"engine": "llamacpp", "objective": "speed"}, {"engine": EngineName.LLAMACPP, "quant": "Q4_K_M"},
         "turbomind: engine: llamacpp in the config"),
        ("v100-32gb", {"engine": "llamacpp", "quant": "Q8_0"}, {"engine": EngineName.LLAMACPP, "quant": "Q8_0"},
         "override: quant: Q8_0"),
        ("v100-32gb", {"quant": "Q4_K_M"}, {"quant": "Q4_K_M", "n_gpu_layers": -1}, "override: quant: Q4_K_M"),
        ("2xv100-32gb", {"gpus": [1]}, {"gpu_indices": (1,), "engine": EngineName.LMDEPLOY}, None),
        ("2xv100-32gb", {"gpus": [0, 1]}, {"gpu_indices": (0, 1), "tp": 2}, None),
        ("2xv100-32gb", {"gpus": [0, 1], "engine": "llamacpp"}, {"gpu_indices": (0, 1), "n_gpu_layers": -1}, None),
        ("2xv100-32gb", {"tp": 2}, {"tp": 2, "gpu_indices": (0, 1)}, "llamacpp: tp: 2 (a TurboMind setting)"),
        ("v100-16gb", {"engine": "llamacpp", "llamacpp": {"n_gpu_layers": 10}}, {"n_gpu_layers": 10},
         "llamacpp-gpu: n_gpu_layers: 10 in the config"),
        ("v100-32gb", {"engine": "llamacpp", "llamacpp": {"slots": 8}, "context": 2048},
         {"slots": 8, "context_tokens": 2048}, None),
        ("v100-32gb", {"lmdeploy": {"max_batch_size": 32}}, {"max_batch_size": 32, "slots": 32}, None),
        ("v100-16gb", {"engine": "llamacpp", "llamacpp": {"n_gpu_layers": 0}}, {"n_gpu_layers": 0,
         "gpu_indices": ()}, "llamacpp-partial: n_gpu_layers: 0 in the config"),
    ],
)  # fmt: skip
def test_overrides_are_honoured(
    zoo: Path, gpus: str, override: dict[str, Any], expect: dict[str, Any], rejected: str | None
) -> None:
    decision = plan(zoo, gpus, {**SEVEN_B, **override}).decision("m")
    assert decision.plan is not None, decision.refusal
    for name, value in expect.items():
        assert getattr(decision.plan, name) == value, name
    if rejected:
        assert any(rejected in f"{rung}: {reason}" for rung, reason in decision.rejected), decision.rejected


@pytest.mark.parametrize(
    ("gpus", "override", "refusal"),
    [
        ("2xv100-16gb", {"gpus": [3]}, "GPU [3] is not in the inventory (it has 0, 1)"),
        ("v100-32gb", {"tp": 2, "engine": "lmdeploy"}, "needs 2 identical GPUs"),
        ("v100-32gb", {"quant": "Q3_K_M"}, "quant: Q3_K_M in the config matches no source (have: Q4_K_M, Q8_0, hf)"),
        ("v100-16gb", {"engine": "lmdeploy", "gpus": [0], "lmdeploy": {"quant_policy": 0}, "context": 2048},
         "turbomind-fp16: needs 15.93 GiB per GPU"),
        ("2xv100-32gb", {"tp": 2, "gpus": [0]}, "tp: 2 but gpus: [0] lists 1 GPU"),
        ("4xv100-32gb", {"gpus": [0, 1, 2], "engine": "lmdeploy"}, "tp 3: TurboMind needs a power of two"),
        ("v100-32gb", {"engine": "lmdeploy", "lmdeploy": {"cache_max_entry_count": 0.05}},
         "cache_max_entry_count 0.05 gives KV 0.91 GiB (needs 2.00 GiB)"),
    ],
)  # fmt: skip
def test_impossible_overrides_are_rejected_with_a_reason(
    zoo: Path, gpus: str, override: dict[str, Any], refusal: str
) -> None:
    decision = plan(zoo, gpus, {**SEVEN_B, **override}).decision("m")
    assert decision.plan is None
    text = (decision.refusal or "") + " ".join(f"{rung}: {reason}" for rung, reason in decision.rejected)
    assert refusal in text, text


@pytest.mark.parametrize(
    ("override", "sources", "refusal"),
    [
        ({"engine": "llamacpp"}, [hf("llama2-7b")],
         "engine: llamacpp in the config, but no source is a GGUF file (have: llama2-7b (hf)); add a GGUF source"),
        ({"engine": "lmdeploy"}, [gguf("llama2-7b.Q8_0.gguf")],
         "engine: lmdeploy in the config means TurboMind, but no source is an HF directory "
         "(have: llama2-7b.Q8_0.gguf (Q8_0))"),
        ({"tp": 2}, [gguf("llama2-7b.Q4_K_M.gguf")], "tp: 2 in the config means TurboMind, but no source is an HF"),
        ({"engine": "lmdeploy", "quant": "Q8_0"}, [hf("llama2-7b"), gguf("llama2-7b.Q8_0.gguf")],
         "quant: Q8_0 and engine: lmdeploy in the config rule out every source"),
    ],
)  # fmt: skip
def test_an_override_that_leaves_no_source_refuses_that_model_only(
    zoo: Path, override: dict[str, Any], sources: list[dict[str, str]], refusal: str
) -> None:
    report = plan(
        zoo,
        "2xv100-16gb",
        {"name": "forced", "sources": sources, **override},
        {"name": "other", "sources": [gguf("llama2-7b.Q4_K_M.gguf")]},
    )
    forced, other = report.decision("forced"), report.decision("other")
    assert forced.plan is None and forced.refusal is not None
    assert refusal in forced.refusal, forced.refusal
    assert other.plan is not None and report.start_order == ["other"]


# --- the shipped configs ------------------------------------------------------------------------------------


def test_default_config_runs_smollm2_on_the_cpu_without_gpus() -> None:
    config = load_config(REPO / "configs" / "default.yaml")
    report = plan_models(config, inventory_from_spec("none"))
    decision = report.decision("smollm2-135m")
    assert decision.plan is not None, decision.refusal
    p = decision.plan
    assert (p.engine, p.n_gpu_layers, p.context_tokens, p.slots, p.gpu_indices) == (
        EngineName.LLAMACPP, 0, config.models[0].context, 4, ())  # fmt: skip
    assert p.llamacpp == config.models[0].llamacpp.model_copy(update={"prompt_cache_mib": 2048})
    assert p.quant == "Q4_1"


def test_the_host_prompt_cache_is_sized_from_host_memory_and_explained() -> None:
    """The plan passes the worker its prompt cache explicitly: the configured size (default 2048 MiB), cut to
    half the host memory the model leaves usable, shown in the estimate and the notes (issue 34)."""
    config = load_config(REPO / "configs" / "default.yaml")
    roomy = plan_models(config, inventory_from_spec("none").model_copy(update={"host_memory_bytes": 64 * 2**30}))
    tight = plan_models(config, inventory_from_spec("none").model_copy(update={"host_memory_bytes": 4 * 2**30}))
    for report, mib in ((roomy, 2048), (tight, None)):
        decision = report.decision("smollm2-135m")
        assert decision.plan is not None and decision.estimate is not None
        got = decision.plan.llamacpp.prompt_cache_mib
        assert got == mib if mib is not None else 0 < got < 2048, got
        assert decision.estimate.prompt_cache_bytes == got * 2**20
        assert any("host prompt cache up to" in note for note in decision.notes), decision.notes


@pytest.mark.parametrize("example", sorted((REPO / "configs" / "examples").glob("*.yaml")), ids=lambda p: p.name)
@pytest.mark.parametrize("gpus", ["none", "v100-16gb", "2xv100-16gb", "v100-32gb", "2xv100-32gb"])
def test_example_configs_plan_on_every_layout(example: Path, gpus: str) -> None:
    """Their model paths do not exist here: every model is refused with 'source not found', none crashes."""
    config = load_config(example)
    report = plan_models(config, inventory_from_spec(gpus))
    assert [d.model for d in report.decisions] == [m.name for m in config.models]
    for decision in report.decisions:
        assert decision.plan is not None or decision.refusal
        if decision.plan is None:
            assert decision.refusal and "source not found" in decision.refusal


def test_replicas_are_placed_apart_while_gpus_are_free_then_share(zoo: Path) -> None:
    """Config `replicas`: each replica of the 7B FP16 gets its own V100-32GB while there is one; a third on two
    GPUs shares one rather than being refused."""
    model = {"name": "m", "sources": [hf("llama2-7b")], "context": 2048, "concurrency": 2, "engine": "lmdeploy"}
    two = plan(zoo, "2xv100-32gb", {**model, "replicas": 2})
    assert [(d.model, d.plan.gpu_indices if d.plan else None) for d in two.decisions] == [("m", (0,)), ("m@2", (1,))]
    three = plan(zoo, "2xv100-32gb", {**model, "concurrency": 1, "context": 1024, "replicas": 3})
    gpus = [tuple(d.plan.gpu_indices) for d in three.decisions if d.plan]
    assert len(gpus) == 3 and set(gpus) == {(0,), (1,)}
    shares = [(d.model, w) for d in three.decisions for w in d.warnings if "other replicas" in w]
    assert len(shares) == 1 and shares[0][0] == "m@3" and "shares GPU 0" in shares[0][1], shares


def test_replicas_auto_weighs_replicas_against_tensor_parallelism(zoo: Path) -> None:
    """`replicas: auto`: a 7B FP16 that fits one V100-32GB, 32 sessions on eight of them: replicas of one GPU
    each predict more in total than the ladder's one placement, so the plan takes them and says so with the
    runner-up; one session can only be one replica; on one GPU there is nothing to choose."""
    from gateway.placement.replica_choice import plan_with_replicas

    model = {"name": "m", "sources": [hf("llama2-7b")], "context": 2048, "engine": "lmdeploy", "replicas": "auto"}
    config = Config.model_validate({"gpus": "8xv100-32gb", "models": [{**model, "concurrency": 32}], "base_dir": zoo})
    resolved, report = plan_with_replicas(config, inventory_from_spec("8xv100-32gb"))
    n = resolved.models[0].replicas
    assert isinstance(n, int) and n > 1 and len(report.plans) == n
    assert len({tuple(p.gpu_indices) for p in report.plans}) == n  # apart
    note = report.decision("m").notes[0]
    assert note.startswith(f"replicas: auto -> {n}: ") and "runner-up" in note, note
    one = Config.model_validate({"gpus": "8xv100-32gb", "models": [{**model, "concurrency": 1}], "base_dir": zoo})
    assert plan_with_replicas(one, inventory_from_spec("8xv100-32gb"))[0].models[0].replicas == 1
    single = Config.model_validate({"gpus": "v100-32gb", "models": [{**model, "concurrency": 8}], "base_dir": zoo})
    assert [m.name for m in plan_with_replicas(single, inventory_from_spec("v100-32gb"))[0].models] == ["m"]


def test_replicas_a_range_chooses_within_it_and_keeps_its_min(zoo: Path) -> None:
    """`replicas: {min, max}`: `auto` within the range; its `min` stands even where no N is a candidate (one
    GPU: the replicas share it, and say so); a range that allows 1 on one GPU costs no plan, as `auto`."""
    from gateway.placement.replica_choice import plan_with_replicas

    model = {"name": "m", "sources": [hf("llama2-7b")], "context": 2048, "engine": "lmdeploy", "concurrency": 32}
    eight = inventory_from_spec("8xv100-32gb")
    ranged = {**model, "replicas": {"min": 2, "max": 3}}
    config = Config.model_validate({"gpus": "8xv100-32gb", "models": [ranged], "base_dir": zoo})
    resolved, report = plan_with_replicas(config, eight)
    n = resolved.models[0].replicas
    assert n in (2, 3) and len(report.plans) == n and report.decision("m").notes[0].startswith(f"replicas: 2-3 -> {n}")
    auto = Config.model_validate({"gpus": "8xv100-32gb", "models": [{**model, "replicas": "auto"}], "base_dir": zoo})
    assert plan_with_replicas(auto, eight)[0].models[0].replicas > 3  # so the range is what held it to 3
    small = {**ranged, "concurrency": 2, "context": 1024}  # two 7B FP16 fit one V100-32GB with a session each
    single = Config.model_validate({"gpus": "v100-32gb", "models": [small], "base_dir": zoo})
    resolved, report = plan_with_replicas(single, inventory_from_spec("v100-32gb"))
    assert [m.name for m in resolved.models] == ["m", "m@2"]
    assert report.decision("m").notes[0].startswith("replicas: 2-3 -> 2 (no placement of 2 replica(s) apart")
    assert any("shares GPU 0" in w for w in report.decision("m@2").warnings)


def test_a_replica_range_is_checked_and_reads_back() -> None:
    spec = {"name": "m", "sources": [{"gguf": "/m/m.gguf"}], "replicas": {"min": 3, "max": 2}}
    with pytest.raises(ValidationError, match="min 3 is over max 2"):
        Config.model_validate({"gpus": "none", "models": [spec]})
    config = Config.model_validate({"gpus": "none", "models": [{**spec, "replicas": {"max": 4}}]})
    assert Config.model_validate(config.model_dump(mode="json")) == config
    remote = {"name": "r", "sources": [{"remote": "http://10.0.0.2:8000/v1"}], "replicas": {"min": 2}}
    with pytest.raises(ValidationError, match="remote endpoint is one server"):
        Config.model_validate({"gpus": "none", "models": [remote]})
