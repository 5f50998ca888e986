"""Issue 26 item 9: the plan keeps precision by default. Among the placements that fit wholly on GPUs and reach
the useful-speed floor, objective quality keeps the highest precision and objective speed the fastest; the plan
says which rule chose and what the runner-up would give (gateway/placement/choice.py, docs/placement.md).
Header-only models of real shapes, simulated V100s."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

from backends.base import EngineName
from gateway.app import create_app
from gateway.cli import cli
from gateway.config import DEFAULT_MIN_TOK_S_PER_STREAM, Config, ConfigError, load_config
from gateway.placement import ModelDecision, PlacementReport, inventory_from_spec, plan_models, render_plan_table
from tests.unit.placement_models import build_zoo
from tests.unit.test_placement_policy import assert_not_overcommitted, gguf, hf

LLAMA_7B_ALL = [hf("llama2-7b"), gguf("llama2-7b.F16.gguf"), gguf("llama2-7b.Q8_0.gguf"), gguf("llama2-7b.Q4_K_M.gguf")]
LLAMA_7B_Q = [gguf("llama2-7b.Q8_0.gguf"), gguf("llama2-7b.Q4_K_M.gguf")]
LLAMA_70B = [hf("llama2-70b"), gguf("llama2-70b.Q8_0.gguf"), gguf("llama2-70b.Q4_K_M.gguf")]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def plan(zoo: Path, gpus: str, *models: dict[str, Any], **top: Any) -> PlacementReport:
    config = Config.model_validate({"gpus": gpus, "models": list(models), "base_dir": zoo, **top})
    report = plan_models(config, inventory_from_spec(gpus))
    assert_not_overcommitted(report)
    return report


def decide(zoo: Path, gpus: str, **model: Any) -> ModelDecision:
    return plan(zoo, gpus, {"name": "m", **model}).decision("m")


def text_of(report: PlacementReport) -> str:
    out = io.StringIO()
    render_plan_table(report, Console(file=out, width=400, color_system=None))
    return out.getvalue()


# --- the three cases of the issue --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("objective", "quant", "tok_s", "runner_quant", "runner_tok_s"),
    [("quality", "Q8_0", 73, "Q4_K_M", 97), ("speed", "Q4_K_M", 97, "Q8_0", 73)],
)
def test_one_session_of_a_7b_on_a_16gb_card_keeps_q8_0_unless_speed_is_asked_for(
    zoo: Path, objective: str, quant: str, tok_s: float, runner_quant: str, runner_tok_s: float
) -> None:
    """The seed took Q4_K_M because it is predicted faster (97 vs 73 tok/s), though Q8_0 fits whole and is far
    above the floor. HF FP16 and the F16 GGUF do not fit a 16 GB card."""
    d = decide(zoo, "v100-16gb", sources=LLAMA_7B_ALL, objective=objective)
    assert d.plan is not None and d.rung == "llamacpp-gpu" and d.plan.n_gpu_layers == -1
    assert (d.plan.quant, d.plan.kv_cache_type) == (quant, "f16")
    assert d.prediction is not None and d.prediction.decode_tok_s_1 == pytest.approx(tok_s, rel=0.05)
    assert d.choice is not None and d.choice.precision == quant
    assert d.choice.rule == ("highest_precision" if objective == "quality" else "fastest")
    runner = d.choice.runner_up
    assert runner is not None and runner.precision == runner_quant
    assert runner.prediction.decode_tok_s_per_stream == pytest.approx(runner_tok_s, rel=0.05)
    other = "speed" if objective == "quality" else "quality"
    assert f"objective: {other} would choose llamacpp-gpu {runner_quant} on 0, 4096 x 1: {runner_tok_s} tok/s" in (
        d.choice.summary
    )


@pytest.mark.parametrize(("objective", "quant", "gpus"), [("quality", "Q8_0", (0, 1, 2)), ("speed", "Q4_K_M", (0, 1))])
def test_a_70b_on_four_32gb_cards_keeps_q8_0_at_10_tok_s_over_q4_k_m_at_18(
    zoo: Path, objective: str, quant: str, gpus: tuple[int, ...]
) -> None:
    """FP16 fits at no tp; Q8_0 needs three GPUs, Q4_K_M two. Q8_0's 10.5 tok/s reaches the 8 tok/s floor."""
    d = decide(zoo, "4xv100-32gb", sources=LLAMA_70B, objective=objective)
    assert d.plan is not None and (d.plan.quant, d.plan.gpu_indices, d.plan.n_gpu_layers) == (quant, gpus, -1)
    assert d.choice is not None and d.choice.runner_up is not None
    speeds = {d.choice.precision: d.prediction, d.choice.runner_up.precision: d.choice.runner_up.prediction}
    q8, q4 = speeds["Q8_0"], speeds["Q4_K_M"]
    assert q8 is not None and q4 is not None
    assert q8.decode_tok_s_1 == pytest.approx(10.5, rel=0.05) and q4.decode_tok_s_1 == pytest.approx(18, rel=0.05)


def test_two_models_on_two_16gb_cards_keep_their_precision(zoo: Path) -> None:
    """The first takes TurboMind FP16 over both GPUs (tp 2); the second fits Q8_0 split over what is left, and
    keeps it over a faster Q4_K_M (the seed took Q4_K_M). With a global `placement: {objective: speed}` it
    takes Q4_K_M again."""
    models = ({"name": "a", "sources": LLAMA_7B_ALL}, {"name": "b", "sources": LLAMA_7B_ALL})
    report = plan(zoo, "2xv100-16gb", *models)
    a, b = report.decision("a"), report.decision("b")
    assert a.plan is not None and a.rung == "turbomind-fp16-tp" and a.plan.gpu_indices == (0, 1)
    assert b.plan is not None and (b.plan.quant, b.plan.gpu_indices, b.plan.n_gpu_layers) == ("Q8_0", (0, 1), -1)
    assert b.choice is not None and b.choice.rule == "highest_precision"
    assert b.choice.runner_up is not None and b.choice.runner_up.precision == "Q4_K_M"
    fast = plan(zoo, "2xv100-16gb", *models, placement={"objective": "speed"}).decision("b")
    assert fast.plan is not None and fast.plan.quant == "Q4_K_M" and fast.objective == "speed"


# --- the floor -------------------------------------------------------------------------------------------------


def test_a_more_precise_fit_below_the_floor_loses_and_the_plan_says_so(zoo: Path) -> None:
    """A floor of 80 tok/s per stream: Q8_0 (73) and Q8_0 with KV q8_0 (80, tier 2) miss it, Q4_K_M (97)
    reaches it."""
    d = decide(zoo, "v100-16gb", sources=LLAMA_7B_Q, min_tok_s_per_stream=85)
    assert d.plan is not None and d.plan.quant == "Q4_K_M" and d.plan.kv_cache_type == "f16"
    assert d.choice is not None and d.choice.rule == "floor" and d.min_tok_s_per_stream == 85
    assert d.choice.runner_up is not None and d.choice.runner_up.precision == "Q8_0"
    assert "Q4_K_M is the highest precision that reaches 85 tok/s per stream (min_tok_s_per_stream)" in d.choice.summary
    assert "more precise but below the floor: llamacpp-gpu Q8_0 on 0, 4096 x 1: 73 tok/s per stream" in d.choice.summary
    assert d.choice.runner_up.why_not == (
        "predicted 73 tok/s per stream at 1 session, below the useful-speed floor (min_tok_s_per_stream 85)"
    )


def test_quantized_kv_that_reaches_the_floor_beats_fewer_weight_bits(zoo: Path) -> None:
    """A floor of 75: Q8_0 with f16 KV (73) misses it, so tier 2 is tried too, and Q8_0 with KV q8_0 (80)
    keeps 8-bit weights where Q4_K_M (97) would keep only 4."""
    d = decide(zoo, "v100-16gb", sources=LLAMA_7B_Q, min_tok_s_per_stream=75)
    assert d.plan is not None and (d.plan.quant, d.plan.kv_cache_type) == ("Q8_0", "q8_0")
    assert d.choice is not None and d.choice.rule == "floor" and d.choice.precision == "Q8_0, KV q8_0"


def test_the_floor_is_per_stream_at_the_configured_sessions(zoo: Path) -> None:
    """16 sessions of 4,096 tokens of Q8_0 on 2 x V100-32GB: 16.9 tok/s each with f16 KV. A floor of 25 takes
    KV q8_0 (26 each, half the KV read); the default floor keeps f16 KV."""
    default = decide(zoo, "2xv100-32gb", sources=[gguf("llama2-7b.Q8_0.gguf")], concurrency=16)
    assert default.plan is not None and default.plan.kv_cache_type == "f16" and default.prediction is not None
    assert default.prediction.sessions == 16
    assert default.prediction.decode_tok_s_per_stream == pytest.approx(16.9, rel=0.05)
    assert default.choice is not None and default.choice.rule == "only_fit"
    high = decide(zoo, "2xv100-32gb", sources=[gguf("llama2-7b.Q8_0.gguf")], concurrency=16, min_tok_s_per_stream=25)
    assert high.plan is not None and high.plan.kv_cache_type == "q8_0" and high.prediction is not None
    assert high.prediction.decode_tok_s_per_stream >= 25
    assert high.choice is not None and high.choice.rule == "floor"


def test_when_no_fit_reaches_the_floor_the_fastest_wins_with_a_warning(zoo: Path) -> None:
    d = decide(zoo, "v100-16gb", sources=LLAMA_7B_Q, min_tok_s_per_stream=500)
    assert d.plan is not None and d.plan.quant == "Q4_K_M"
    assert d.choice is not None and d.choice.rule == "none_reach_floor"
    assert d.choice.summary.startswith("no fit reaches 500 tok/s per stream (min_tok_s_per_stream), so the fastest")
    assert any(w.startswith("below the useful-speed floor: llamacpp-gpu Q4_K_M") for w in d.warnings), d.warnings


def test_a_floor_of_zero_is_no_floor(zoo: Path) -> None:
    d = decide(zoo, "4xv100-32gb", sources=LLAMA_70B, min_tok_s_per_stream=0)
    assert d.plan is not None and d.plan.quant == "Q8_0"
    assert d.choice is not None and d.choice.summary.startswith(
        "objective quality: Q8_0 is the highest precision of the 2 fits that reach 0 tok/s per stream"
    )


def test_a_whole_gpu_fit_beats_a_more_precise_partial_offload(zoo: Path) -> None:
    """70B on 2 x V100-32GB: Q8_0 only fits with layers in host memory; Q4_K_M fits whole and wins."""
    d = decide(zoo, "2xv100-32gb", sources=LLAMA_70B)
    assert d.plan is not None and d.rung == "llamacpp-gpu" and d.plan.quant == "Q4_K_M" and d.plan.n_gpu_layers == -1
    assert d.choice is not None and d.choice.rule == "only_fit"
    assert not any(w.startswith("partial offload") for w in d.warnings)


# --- equal precision, many sessions ------------------------------------------------------------------------------


def test_equal_precision_goes_by_speed_so_turbomind_batches_many_sessions(zoo: Path) -> None:
    """TurboMind FP16 and llama.cpp F16 are both 16-bit: speed decides between them as before."""
    d = decide(zoo, "v100-32gb", sources=[hf("llama2-7b"), gguf("llama2-7b.F16.gguf")], concurrency=8)
    assert d.plan is not None and d.plan.engine is EngineName.LMDEPLOY
    assert d.choice is not None and d.choice.rule == "highest_precision" and d.choice.precision == "float16"
    (alternative,) = d.alternatives
    assert alternative.precision == "F16" and alternative.why_not.startswith("within 15% of turbomind-fp16")


# --- settings: global, per model, the renamed key -------------------------------------------------------------------


def test_the_defaults_are_quality_throughput_and_8_tok_s() -> None:
    config = Config.model_validate({"models": [{"name": "m", "sources": [gguf("m.gguf")]}]})
    settings = config.placement_for(config.models[0])
    assert (settings.objective, settings.speed_metric, settings.min_tok_s_per_stream) == ("quality", "throughput", 8.0)
    assert DEFAULT_MIN_TOK_S_PER_STREAM == 8.0


def test_a_model_key_overrides_the_placement_section(zoo: Path) -> None:
    top = {"placement": {"objective": "speed", "min_tok_s_per_stream": 5}}
    report = plan(zoo, "v100-16gb", {"name": "own", "sources": LLAMA_7B_Q, "objective": "quality"},
                  {"name": "global", "sources": [gguf("llama2-7b.Q4_K_M.gguf")]}, **top)  # fmt: skip
    own, rest = report.decision("own"), report.decision("global")
    assert (own.objective, own.min_tok_s_per_stream, rest.objective) == ("quality", 5, "speed")


@pytest.mark.parametrize("old", ["throughput", "latency"])
@pytest.mark.parametrize("where", ["model", "placement"])
def test_the_old_objective_values_name_the_new_keys(tmp_path: Path, old: str, where: str) -> None:
    model = f"{{name: m, sources: [{{gguf: m.gguf}}]{', objective: ' + old if where == 'model' else ''}}}"
    text = (f"placement: {{objective: {old}}}\n" if where == "placement" else "") + f"models: [{model}]\n"
    path = tmp_path / "voltgate.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    key = "models.0.objective" if where == "model" else "placement.objective"
    assert f"{key}: {old!r} was renamed: write 'objective: speed' and 'speed_metric: {old}'" in str(err.value)


def test_a_negative_floor_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "voltgate.yaml"
    path.write_text("placement: {min_tok_s_per_stream: -1}\nmodels: [{name: m, sources: [{gguf: m.gguf}]}]\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "placement.min_tok_s_per_stream: Input should be greater than or equal to 0" in str(err.value)


# --- the explanation: JSON, table, voltgate plan, /v1/placement ------------------------------------------------


def test_plan_json_names_the_rule_and_the_runner_up_with_its_precision_and_speed(zoo: Path) -> None:
    report = plan(zoo, "v100-16gb", {"name": "m", "sources": LLAMA_7B_ALL})
    decision = json.loads(report.model_dump_json())["decisions"][0]
    assert (decision["objective"], decision["speed_metric"], decision["min_tok_s_per_stream"]) == (
        "quality", "throughput", 8.0)  # fmt: skip
    choice = decision["choice"]
    assert (choice["rule"], choice["precision"]) == ("highest_precision", "Q8_0")
    assert choice["runner_up"]["precision"] == "Q4_K_M"
    assert choice["runner_up"]["prediction"]["decode_tok_s_per_stream"] == pytest.approx(97, rel=0.05)
    assert choice["runner_up"]["option"] == "llamacpp-gpu Q4_K_M on 0, 4096 x 1"
    assert [a["precision"] for a in decision["alternatives"]] == ["Q4_K_M"]


def test_plan_table_prints_the_rule_and_the_runner_up(zoo: Path) -> None:
    text = text_of(plan(zoo, "v100-16gb", {"name": "m", "sources": LLAMA_7B_ALL}))
    assert (
        "> rule highest_precision: objective quality: Q8_0 is the highest precision of the 2 fits that reach "
        "8 tok/s per stream; predicted 73 tok/s per stream at 1 session; objective: speed would choose "
        "llamacpp-gpu Q4_K_M on 0, 4096 x 1: 97 tok/s per stream at 1 session"
    ) in text
    assert (
        "not chosen: lower precision (Q4_K_M) than Q8_0: objective quality keeps the highest precision that "
        "reaches the floor (predicted 97 vs 73 tok/s per stream at 1 session)"
    ) in text


def test_voltgate_plan_prints_the_choice_and_its_json_carries_it(zoo: Path, tmp_path: Path) -> None:
    path = tmp_path / "voltgate.yaml"
    sources = [{"gguf": str(zoo / name)} for name in ("llama2-7b.Q8_0.gguf", "llama2-7b.Q4_K_M.gguf")]
    models = [{"name": "m", "sources": sources, "objective": "speed"}]
    path.write_text(json.dumps({"gpus": "v100-16gb", "models": models, "server": {"data_dir": str(tmp_path)}}))
    table = CliRunner().invoke(cli, ["plan", "--config", str(path)], env={"COLUMNS": "300"})
    assert table.exit_code == 0, table.output
    assert "> rule fastest: objective speed: Q4_K_M is the fastest for throughput" in table.output
    raw = CliRunner().invoke(cli, ["plan", "--config", str(path), "--json"])
    assert json.loads(raw.stdout)["decisions"][0]["choice"]["rule"] == "fastest"


async def test_v1_placement_serves_the_choice(zoo: Path, tmp_path: Path) -> None:
    config = Config.model_validate({"gpus": "v100-16gb", "base_dir": zoo, "auth": {"keys_env": None},
                                    "server": {"data_dir": str(tmp_path)},
                                    "models": [{"name": "m", "sources": LLAMA_7B_Q}]})  # fmt: skip
    report = plan_models(config, inventory_from_spec(config.gpus))
    app = create_app(config, [], placement=json.loads(report.model_dump_json()), metrics=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            response = await http.get("/v1/placement")
    assert response.status_code == 200, response.text
    choice = response.json()["decisions"][0]["choice"]
    assert choice["rule"] == "highest_precision" and choice["runner_up"]["precision"] == "Q4_K_M"
