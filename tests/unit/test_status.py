"""The status page's report (`gateway.ops.status`) for one key: the models it may see, memory bars per pool from
the placement's inventory and the residency's holdings, and whose recent errors it sees."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.base import DeploymentPlan, EngineName
from gateway.config import ModelSpec
from gateway.errors import GatewayError
from gateway.ops.auth import Principal
from gateway.ops.status import status_report
from gateway.placement.inventory import inventory_from_spec
from gateway.placement.policy import reasoning_notes
from gateway.protocol.reasoning import ReasoningDefault
from tests.unit.test_live_speed import PREDICTION
from tests.unit.test_residency import MB, Harness


def placement() -> dict[str, object]:
    return {"inventory": inventory_from_spec("2xv100-16gb").model_dump(mode="json"), "decisions": []}


async def test_a_key_sees_its_models_and_every_pool() -> None:
    h = Harness({"a": ("on_demand", 300 * MB), "b": ("on_demand", 200 * MB)}, budget=1024 * MB)
    (await h.hold("a")).release()
    report = status_report(h.registry, h.residency, h.metrics, placement(), principal=Principal("team", models=("a",)),
                           admin=False, open_mode=False, accepting=True)  # fmt: skip
    assert [m.name for m in report.models] == ["a"]
    assert report.models[0].state == "ready" and report.models[0].gpus == []
    pools = {p.pool: p for p in report.pools}
    assert set(pools) == {"gpu0", "gpu1", "host"}
    assert pools["gpu0"].simulated and pools["gpu0"].used == [] and pools["gpu0"].kind == "gpu"
    host = pools["host"]
    assert [(u.model, u.bytes, u.measured) for u in host.used] == [("a", 300 * MB, False)]  # b is not loaded
    assert host.total_bytes == 1024 * MB and host.free_bytes == 724 * MB
    assert len(report.speed) == 60 and report.speed_bin_s == 10


async def test_recent_errors_are_the_keys_own_unless_admin() -> None:
    h = Harness({"a": ("on_demand", 300 * MB)}, budget=None)
    for key in ("team", "other", "-"):
        h.metrics.activity.error(request_id=key, model="a", endpoint="chat", status=401, key_id=key)

    def seen(principal: Principal, admin: bool) -> list[str]:
        report = status_report(h.registry, h.residency, h.metrics, {}, principal=principal, admin=admin,
                               open_mode=False, accepting=True)  # fmt: skip
        return [e.request_id for e in report.errors]

    assert seen(Principal("team"), admin=False) == ["team"]
    assert seen(Principal("ops", scopes=("admin",)), admin=True) == ["-", "other", "team"]


async def test_a_failed_model_says_why() -> None:
    h = Harness({"bad": ("on_demand", 100 * MB)}, budget=None)
    h.workers["bad"].fail = "exited with code 1 during start; last log lines: invalid GGUF"
    with pytest.raises(GatewayError):
        await h.hold("bad", wait_s=5)
    report = status_report(h.registry, h.residency, h.metrics, {}, principal=Principal("ops"), admin=True,
                           open_mode=False, accepting=True)  # fmt: skip
    (model,) = report.models
    assert model.state == "failed" and model.reason is not None and "invalid GGUF" in model.reason
    assert report.pools == []  # no inventory, no host budget: nothing to draw


async def test_on_a_cluster_every_host_has_its_bars_and_each_model_names_its_host() -> None:
    from gateway.lifecycle.memory import NoProbe
    from gateway.placement.inventory import Inventory

    h = Harness({"a": ("on_demand", 300 * MB)}, budget=None)
    gpus, none = inventory_from_spec("v100-32gb"), Inventory(source="none", host_memory_bytes=4096 * MB)
    h.residency.pools.add_host("x", gpus, 2048 * MB, NoProbe())
    h.residency.pools.add_host("y", none, 1024 * MB, NoProbe())
    hosts = [{"host": "x", "report": {"inventory": gpus.model_dump(mode="json")}},
             {"host": "y", "report": {"inventory": none.model_dump(mode="json")}}]  # fmt: skip
    cluster = {"cluster": True, "hosts": hosts, "decisions": [{"model": "a", "host": "y"}]}
    report = status_report(h.registry, h.residency, h.metrics, cluster, principal=Principal("ops"), admin=True,
                           open_mode=False, accepting=True)  # fmt: skip
    assert [(p.pool, p.host) for p in report.pools] == [("x:gpu0", "x"), ("x:host", "x"), ("y:host", "y")]
    assert report.pools[0].label.endswith("· host x") and report.pools[2].label == "host memory · host y"
    assert report.pools[2].total_bytes == 4096 * MB and report.pools[2].reserved_bytes == 3072 * MB
    assert report.models[0].cluster_host == "y" and report.models[0].host == "local"


async def test_each_model_shows_its_prefix_hit_share_and_the_prefill_it_saved() -> None:
    h = Harness({"a": ("on_demand", 100 * MB), "b": ("on_demand", 100 * MB)}, budget=None)
    h.metrics.count_cached("a", 1000, 900)
    h.metrics.count_cached("a", 1000, 0)
    h.metrics.count_cached("b", 1000, None)  # its engine does not say (LMDeploy): no share, not 0
    report = status_report(h.registry, h.residency, h.metrics, {}, principal=Principal("ops"), admin=True,
                           open_mode=False, accepting=True)  # fmt: skip
    shares = {m.name: (m.prefix_hit_share, m.prefill_saved_s) for m in report.models}
    assert shares == {"a": (0.45, 0.0), "b": (None, 0.0)}  # no prefill speed known yet: no seconds


async def test_a_reasoning_models_first_answer_token_is_predicted_after_its_thinking() -> None:
    """One stream at 100 tok/s, TTFT 0.522 s (tests/unit/test_live_speed.py): 300 thinking tokens first are 3 s
    more. A default that does not bound the thinking predicts no answer time."""
    h = Harness({"r": ("on_demand", 100 * MB), "plain": ("on_demand", 100 * MB)}, budget=None)
    h.registry.resolve("r").reasoning = ReasoningDefault(effort="medium", budget_tokens=300)
    h.metrics.set_predictions({"r": PREDICTION, "plain": PREDICTION})
    report = status_report(h.registry, h.residency, h.metrics, {}, principal=Principal("ops"), admin=True,
                           open_mode=False, accepting=True)  # fmt: skip
    models = {m.name: m for m in report.models}
    assert (models["r"].thinking_tokens, models["r"].predicted_answer_s) == (300, 3.522)
    assert (models["plain"].thinking_tokens, models["plain"].predicted_answer_s) == (None, None)
    assert models["r"].predicted_ttft_s == models["plain"].predicted_ttft_s == 0.522


@pytest.mark.parametrize(
    ("reasoning", "engine", "notes"),
    [
        ({}, EngineName.LLAMACPP, []),
        ({"effort": "none"}, EngineName.LLAMACPP,
         ["reasoning: thinking off by default; the first token is the answer's"]),
        ({"effort": "high"}, EngineName.LLAMACPP,
         ["reasoning: effort high bounds no thinking; the first answer token waits for all of it"]),
        ({"budget_tokens": 300}, EngineName.LLAMACPP,
         ["reasoning: up to 300 thinking tokens before the answer: first answer token after 3.52 s (1 stream)"]),
        ({"effort": "low"}, EngineName.LMDEPLOY,
         ["reasoning: up to 1024 thinking tokens before the answer: first answer token after 10.76 s (1 stream)",
          "reasoning: TurboMind has no thinking budget; the model thinks as long as it wants"]),
    ],
)  # fmt: skip
def test_the_plan_says_when_a_reasoning_models_first_answer_token_comes(
    reasoning: dict[str, object], engine: EngineName, notes: list[str]
) -> None:
    spec = ModelSpec.model_validate({"name": "r", "sources": [{"gguf": "/r.gguf"}], "reasoning": reasoning})
    plan = DeploymentPlan(model="r", engine=engine, source_path=Path("/r"), model_format="hf", context_tokens=4096)
    assert reasoning_notes(spec, plan, PREDICTION) == notes
