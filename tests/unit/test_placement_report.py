"""`voltgate plan` output: the rich table explains every decision; the JSON carries the same facts."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from gateway.config import Config
from gateway.placement import PlacementReport, inventory_from_spec, plan_models, render_plan_table
from tests.unit.placement_models import build_zoo


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> PlacementReport:
    zoo = build_zoo(tmp_path_factory.mktemp("zoo"))
    config = Config.model_validate(
        {
            "gpus": "v100-16gb",
            "base_dir": zoo,
            "models": [
                {"name": "chat", "sources": [{"hf": "llama2-7b"}, {"gguf": "llama2-7b.Q8_0.gguf"}]},
                {"name": "huge", "sources": [{"hf": "llama2-70b"}]},
                {"name": "ghost", "sources": [{"hf": "/models/ghost"}]},
            ],
        }
    )
    return plan_models(config, inventory_from_spec(config.gpus))


def render(report: PlacementReport) -> str:
    out = io.StringIO()
    render_plan_table(report, Console(file=out, width=240, color_system=None))
    return out.getvalue()


def test_table_shows_engine_source_precision_and_memory_terms(report: PlacementReport) -> None:
    text = render(report)
    assert "llama.cpp" in text and "llama2-7b.Q8_0.gguf" in text and "Q8_0" in text
    assert "weights 6.67" in text and "kv_cache 2.00" in text and "margin 1.00" in text
    assert "Tesla V100-SXM2-16GB" in text


def test_table_explains_rejections_and_refusals(report: PlacementReport) -> None:
    text = render(report)
    assert "x turbomind-fp16: needs 17.37 GiB per GPU" in text
    assert "refused: fits nowhere: short by 117.3 GiB" in text
    assert "ghost" in text and "source not found: /models/ghost" in text


def test_json_has_plans_estimates_and_rejections(report: PlacementReport) -> None:
    data = json.loads(report.model_dump_json())
    chat = data["decisions"][0]
    assert chat["plan"]["engine"] == "llamacpp" and chat["plan"]["n_gpu_layers"] == -1
    assert chat["estimate"]["terms_gib"]["weights"] == 6.67
    assert ["turbomind-fp16", chat["rejected"][0][1]] == chat["rejected"][0]
    assert data["decisions"][1]["plan"] is None and "117.3 GiB" in data["decisions"][1]["refusal"]
    assert data["start_order"] == ["chat"]
    assert data["inventory"]["gpus"][0]["total_bytes"] == 16_160 << 20


def test_rejections_unpack_as_rung_and_reason(report: PlacementReport) -> None:
    rung, reason = report.decision("chat").rejected[0]
    assert rung == "turbomind-fp16" and reason.startswith("needs 17.37 GiB")


def test_plans_are_in_start_order(report: PlacementReport) -> None:
    assert [p.model for p in report.plans] == ["chat"]
    assert isinstance(report.plans[0].source_path, Path)
