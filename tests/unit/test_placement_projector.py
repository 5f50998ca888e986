"""An image model's projector in the llama.cpp fit (gateway/placement/estimate.py `fit_llamacpp`): its GGUF's
size is counted where the worker loads it (the first GPU when any layer is offloaded, else host memory) and
named in the plan. Header-only models of real shapes, simulated V100s; a sparse projector file."""

from __future__ import annotations

from pathlib import Path

from gateway.config import Config
from gateway.placement import ModelDecision, inventory_from_spec, plan_models
from gateway.placement.estimate import GIB, MemoryEstimate
from tests.unit.placement_models import QWEN2_0_5B, write_gguf

PROJECTOR = 600 * 1024 * 1024


def _decide(folder: Path, gpus: str, *, projector: bool) -> ModelDecision:
    gguf = write_gguf(folder / "qwen2-0.5b.Q8_0.gguf", QWEN2_0_5B, "Q8_0")
    mmproj = folder / "mmproj-qwen2.gguf"
    if projector:
        with mmproj.open("wb") as out:
            out.truncate(PROJECTOR)  # sparse: its size is what placement reads
    model = {
        "name": "m",
        "sources": [{"gguf": str(gguf)}],
        "context": 4096,
        "mmproj": str(mmproj) if projector else False,
    }
    config = Config.model_validate({"gpus": gpus, "models": [model], "base_dir": folder})
    decision = plan_models(config, inventory_from_spec(gpus)).decision("m")
    assert decision.plan is not None and decision.estimate is not None
    return decision


def _estimate(decision: ModelDecision) -> MemoryEstimate:
    assert decision.estimate is not None
    return decision.estimate


def test_the_projector_is_counted_on_the_first_gpu_and_named_in_the_plan(tmp_path: Path) -> None:
    decision = _decide(tmp_path, "v100-16gb", projector=True)
    estimate = _estimate(decision)
    assert estimate.vision_encoder_bytes == PROJECTOR
    assert estimate.terms_gib["vision_encoder"] == round(PROJECTOR / GIB, 2)
    assert any("the image projector's weights (0.59 GiB) in GPU 0" in note for note in decision.notes), decision.notes


def test_the_projector_adds_its_size_to_the_gpu_and_on_the_cpu_to_host_memory(tmp_path: Path) -> None:
    for gpus in ("v100-16gb", "none"):
        with_it = _estimate(_decide(tmp_path / gpus / "with", gpus, projector=True))
        without = _estimate(_decide(tmp_path / gpus / "without", gpus, projector=False))
        if gpus == "none":
            assert with_it.host_bytes - without.host_bytes == PROJECTOR and with_it.gpu_bytes == {}
        else:
            assert with_it.gpu_bytes[0] - without.gpu_bytes[0] == PROJECTOR
            assert with_it.host_bytes == without.host_bytes
