"""`replicas: auto` over a cluster (docs/replicas.md): N from 1 to the GPUs of the hosts a model may run on, each
N planned with `plan_cluster`, the same candidate and winner rules as on one host; `ClusterServing` resolves it
at its first plan and keeps N through a host's loss and a new host's join."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.cli import cli
from gateway.cluster import ClusterReport, HostView, plan_cluster, plan_cluster_with_replicas
from gateway.cluster.serve import ClusterServing
from gateway.config import Config
from gateway.placement import inventory_from_spec
from tests.unit.placement_models import build_zoo

SEVEN_B = {"name": "m", "sources": [{"hf": "llama2-7b"}], "context": 2048, "engine": "lmdeploy"}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def hosts(*specs: str) -> list[HostView]:
    return [HostView(name="abc"[k], inventory=inventory_from_spec(gpus)) for k, gpus in enumerate(specs)]


def config(zoo: Path, *models: dict[str, Any]) -> Config:
    return Config.model_validate({"gpus": "none", "models": list(models), "base_dir": zoo})


def where(report: ClusterReport, model: str) -> tuple[str | None, Any]:
    return report.host_of(model), report.decision(model).decision.plan


def decided(report: ClusterReport) -> list[tuple[str, str | None, Any]]:
    return [(d.model, d.host, d.decision.plan) for d in report.decisions]


def test_auto_spreads_replicas_over_two_hosts_and_says_why(zoo: Path) -> None:
    """A 7B FP16 of 32 sessions on two hosts of 4 x V100-16GB: a replica per host predicts more in total than
    one placement (tp over one host's GPUs), so the plan takes two, one on each host, and the model's first
    note says so with the runner-up and the Ns skipped."""
    resolved, report = plan_cluster_with_replicas(config(zoo, {**SEVEN_B, "replicas": "auto", "concurrency": 32}),
                                                  hosts("4xv100-16gb", "4xv100-16gb"))  # fmt: skip
    n = resolved.models[0].replicas
    assert isinstance(n, int) and n > 1
    assert [m.name for m in resolved.models] == ["m", *(f"m@{k}" for k in range(2, n + 1))]
    assert all(m.concurrency == -(-32 // n) for m in resolved.models)
    placed = [d for d in report.decisions if d.decision.plan is not None]
    assert len(placed) == n and {d.host for d in placed} == {"a", "b"}
    note = report.decision("m").decision.notes[0]
    assert note.startswith(f"replicas: auto -> {n}: ") and "runner-up" in note and "not wholly on GPUs" in note, note
    host = next(h for h in report.hosts if h.host == report.host_of("m"))
    assert host.report.decision("m").notes[0] == note  # the host's report shows it too


def test_auto_never_puts_two_replicas_on_one_gpu(zoo: Path) -> None:
    """64 sessions: four tp-4 replicas would be two on each host's four GPUs, each predicted as if it had them
    alone (their compute counted twice), so 4 is skipped and every chosen replica has GPUs of its own."""
    resolved, report = plan_cluster_with_replicas(config(zoo, {**SEVEN_B, "replicas": "auto", "concurrency": 64}),
                                                  hosts("4xv100-16gb", "4xv100-16gb"))  # fmt: skip
    note = report.decision("m").decision.notes[0]
    assert "4 would put replicas on the same GPU" in note, note
    used = [(d.host, i) for d in report.decisions if d.decision.plan for i in d.decision.plan.gpu_indices]
    assert len(used) == len(set(used)) and len(resolved.models) > 1


def test_auto_is_one_where_replicas_do_not_fit_apart(zoo: Path) -> None:
    """A 13B FP16 fits only over host a's four V100-16GB (tp 4); host b's one GPU cannot hold a replica."""
    model = {**SEVEN_B, "sources": [{"hf": "llama2-13b"}], "replicas": "auto", "concurrency": 32}
    resolved, report = plan_cluster_with_replicas(config(zoo, model), hosts("4xv100-16gb", "v100-16gb"))
    assert [(m.name, m.replicas) for m in resolved.models] == [("m", 1)]
    assert report.host_of("m") == "a"
    note = report.decision("m").decision.notes[0]
    assert note.startswith("replicas: auto -> 1: ") and "2 not wholly on GPUs" in note, note


def test_auto_never_changes_another_models_host_or_plan(zoo: Path) -> None:
    """`m` (auto, first in the config) and `o`, a 7B of 8 sessions: more replicas of `m` would take GPUs `o`
    is planned on, so those Ns are skipped and `o` stays where the plan with one replica of `m` puts it."""
    other = {**SEVEN_B, "name": "o", "concurrency": 8, "replicas": 1}
    auto = config(zoo, {**SEVEN_B, "replicas": "auto", "concurrency": 32}, other)
    cluster = hosts("4xv100-16gb", "4xv100-16gb")
    resolved, report = plan_cluster_with_replicas(auto, cluster)
    one = plan_cluster(config(zoo, {**SEVEN_B, "replicas": 1, "concurrency": 32}, other), cluster)
    assert where(report, "o") == where(one, "o") and where(report, "o")[0] is not None
    assert "2 would change another model's plan" in report.decision("m").decision.notes[0]
    assert [m.name for m in resolved.models] == ["m", "o"]


def test_a_config_without_auto_plans_as_plan_cluster(zoo: Path) -> None:
    fixed = config(zoo, {**SEVEN_B, "replicas": 2, "concurrency": 32})
    cluster = hosts("4xv100-16gb", "4xv100-16gb")
    resolved, report = plan_cluster_with_replicas(fixed, cluster)
    # the decisions, not the whole reports: a host of a simulated inventory reports no memory, so each plan
    # reads this machine's MemAvailable for its host budget, which moves between two plans on a busy host
    assert resolved == fixed and decided(report) == decided(plan_cluster(fixed, cluster))


def test_serving_resolves_auto_once_and_keeps_n_when_hosts_change(zoo: Path) -> None:
    """The first plan chooses N and `ClusterServing.config` keeps it, replicas made: the app is built from that
    config; after host b is lost its replica is re-placed or refused as a model of its own (never a new N), and
    a host that joins takes it."""
    serving = ClusterServing(config(zoo, {**SEVEN_B, "replicas": "auto", "concurrency": 32}), discover=None)  # type: ignore[arg-type]
    views = {v.name: v for v in hosts("4xv100-16gb", "4xv100-16gb", "4xv100-16gb")}
    serving.views = {name: views[name] for name in "ab"}
    serving.agents = dict.fromkeys(serving.views, None)  # type: ignore[arg-type]
    plans, refused = serving.initial()
    chosen = serving.config.models
    n = chosen[0].replicas
    assert isinstance(n, int) and n > 1 and refused == {}
    assert sorted(p.model for p in plans) == sorted(m.name for m in chosen)
    assert set(serving.assignment.values()) == {"a", "b"}
    assert serving.report is not None and serving.report.decision("m").decision.notes[0].startswith("replicas: auto")

    lost = {m for m, h in serving.assignment.items() if h == "b"}
    for table in (serving.views, serving.agents):
        table.pop("b")
    for model in lost:
        del serving.assignment[model]
    kept = dict(serving.assignment)
    report = serving.plan()
    assert serving.config.models == chosen  # the same N, the same replicas
    assert {d.model for d in report.decisions} == {m.name for m in chosen}
    assert all(report.host_of(m) == h for m, h in kept.items())  # nothing serving moves
    assert all(report.host_of(m) in (None, "a") for m in lost)
    assert not any(n.startswith("replicas: auto") for d in report.decisions for n in d.decision.notes)

    serving.views["c"], serving.agents["c"] = views["c"], None  # type: ignore[assignment]
    report = serving.plan()
    assert serving.config.models == chosen
    assert {report.host_of(m) for m in lost} <= {"a", "c"} and all(report.host_of(m) for m in lost)


def test_plan_cluster_command_resolves_auto(zoo: Path, tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("hosts:\n  a: {gpus: 4xv100-16gb}\n  b: {gpus: 4xv100-16gb}\n")
    (tmp_path / "voltgate.yaml").write_text(
        f"models:\n  - {{name: m, sources: [{{hf: {zoo}/llama2-7b}}], context: 2048, engine: lmdeploy, "
        "concurrency: 32, replicas: auto}\n"
    )
    args = ["plan", "--config", str(tmp_path / "voltgate.yaml"), "--cluster", str(tmp_path / "cluster.yaml")]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    decisions = json.loads(result.stdout)["decisions"]
    assert [d["model"] for d in decisions][:2] == ["m", "m@2"] and {d["host"] for d in decisions} == {"a", "b"}
    assert decisions[0]["decision"]["notes"][0].startswith("replicas: auto -> ")
