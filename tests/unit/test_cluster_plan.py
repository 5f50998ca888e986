"""One plan over several hosts: each model on one host, tensor parallelism within a host, host constraints,
missing files, refusals explained per host, and `voltgate plan --cluster FILE`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from backends.base import EngineName
from gateway.cli import cli
from gateway.cluster import ClusterFileError, ClusterReport, HostView, load_cluster_file, plan_cluster
from gateway.config import Config, ConfigError, load_config
from gateway.placement import inventory_from_spec
from gateway.placement.estimate import MARGIN_BYTES
from tests.unit.placement_models import build_zoo


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def host(name: str, gpus: str, missing: tuple[str, ...] = ()) -> HostView:
    return HostView(name=name, inventory=inventory_from_spec(gpus), missing=frozenset(missing))


def plan(zoo: Path, hosts: list[HostView], *models: dict[str, Any]) -> ClusterReport:
    config = Config.model_validate({"gpus": "none", "models": list(models), "base_dir": zoo})
    report = plan_cluster(config, hosts)
    for placement in report.hosts:  # no host's GPU holds more than its free memory less the margin
        inventory = placement.report.inventory
        for gpu in inventory.gpus:
            used = sum(d.estimate.gpu_bytes.get(gpu.index, 0) for d in placement.report.decisions
                       if d.plan and d.estimate)  # fmt: skip
            assert used <= gpu.free_bytes - MARGIN_BYTES
        for d in placement.report.decisions:  # a plan only names GPUs its host has
            assert d.plan is None or all(i < len(inventory.gpus) for i in d.plan.gpu_indices)
    return report


def test_models_spread_over_heterogeneous_hosts_each_on_one_host(zoo: Path) -> None:
    report = plan(
        zoo,
        [host("ws", "v100-16gb"), host("dgx", "2xv100-32gb"), host("box", "2xv100-16gb")],
        {"name": "big-13b", "sources": [{"hf": "llama2-13b"}]},
        {"name": "mid-7b", "sources": [{"hf": "llama2-7b"}]},
        {"name": "small-q8", "sources": [{"gguf": "llama2-7b.Q8_0.gguf"}]},
        {"name": "other-7b", "sources": [{"hf": "llama2-7b"}]},
    )
    assert [h.host for h in report.hosts] == ["dgx", "box", "ws"]  # biggest first
    hosts = {d.model: d.host for d in report.decisions}
    assert hosts["big-13b"] == "dgx"
    assert set(hosts.values()) >= {"dgx", "box"}  # what the biggest host cannot hold goes to the next
    assert all(h is not None for h in hosts.values())
    by_host = report.plans_by_host()
    assert sorted(p.model for plans in by_host.values() for p in plans) == sorted(hosts)
    for d in report.decisions:
        assert d.decision.prediction is not None  # predicted on that host's GPUs
        assert d.considered and d.considered[-1].host == d.host


def test_tensor_parallel_stays_within_a_host(zoo: Path) -> None:
    """A 13B in FP16 (26 GB) fits two 16 GB cards of one host, never one card here and one there."""
    m = {"name": "m", "sources": [{"hf": "llama2-13b"}], "min_context": 2048}
    report = plan(zoo, [host("a", "v100-16gb"), host("b", "v100-16gb"), host("c", "2xv100-16gb")], m)
    d = report.decision("m")
    assert d.host == "c" and d.decision.plan is not None
    assert d.decision.plan.engine is EngineName.LMDEPLOY and d.decision.plan.tp == 2
    split = plan(zoo, [host("a", "v100-16gb"), host("b", "v100-16gb")], m).decision("m")
    assert split.host is None and split.decision.refusal and "a: refused" in split.decision.refusal


def test_a_host_constraint_is_honoured_and_explained(zoo: Path) -> None:
    report = plan(zoo, [host("dgx", "2xv100-32gb"), host("ws", "v100-16gb")],
                  {"name": "m", "sources": [{"gguf": "llama2-7b.Q8_0.gguf"}], "hosts": ["ws"]})  # fmt: skip
    d = report.decision("m")
    assert d.host == "ws"
    assert any(c.host == "dgx" and "not in the model's hosts (ws)" in c.outcome for c in d.considered)


def test_a_host_without_the_model_file_is_skipped(zoo: Path) -> None:
    report = plan(zoo, [host("dgx", "2xv100-32gb", missing=("m",)), host("ws", "v100-16gb")],
                  {"name": "m", "sources": [{"gguf": "llama2-7b.Q8_0.gguf"}]})  # fmt: skip
    d = report.decision("m")
    assert d.host == "ws"
    assert any(c.host == "dgx" and c.outcome == "has no file of this model" for c in d.considered)


def test_a_model_no_host_can_hold_is_refused_with_every_hosts_answer(zoo: Path) -> None:
    report = plan(zoo, [host("a", "v100-16gb"), host("b", "v100-16gb")],
                  {"name": "huge", "sources": [{"hf": "llama2-70b"}]},
                  {"name": "pinned-away", "sources": [{"hf": "llama2-7b"}], "hosts": ["elsewhere"]})  # fmt: skip
    huge, away = report.decision("huge"), report.decision("pinned-away")
    assert huge.host is None and huge.decision.plan is None and huge.decision.refusal
    assert "a: refused" in huge.decision.refusal and "b: refused" in huge.decision.refusal
    assert away.host is None and away.decision.refusal
    assert "not in the cluster: elsewhere" in away.decision.refusal
    assert not any(d.model == "huge" for h in report.hosts for d in h.report.decisions)


def test_the_cpu_is_a_last_resort_after_every_hosts_gpus(zoo: Path) -> None:
    """A GGUF the first host can place only on its CPU goes to a later host with a free GPU."""
    report = plan(zoo, [host("cpu-box", "none"), host("ws", "v100-16gb")],
                  {"name": "m", "sources": [{"gguf": "llama2-7b.Q8_0.gguf"}]},
                  {"name": "n", "sources": [{"gguf": "llama2-7b.Q8_0.gguf"}]})  # fmt: skip
    hosts = {d.model: d.host for d in report.decisions}
    assert "ws" in hosts.values()
    on_ws = next(d for d in report.decisions if d.host == "ws")
    assert on_ws.decision.plan is not None and on_ws.decision.plan.gpu_indices == (0,)


def test_hosts_key_names_must_be_host_names(tmp_path: Path) -> None:
    (tmp_path / "c.yaml").write_text("models:\n  - name: m\n    sources: [{gguf: x.gguf}]\n    hosts: ['a b']\n")
    with pytest.raises(ConfigError, match="hosts"):
        load_config(tmp_path / "c.yaml")


def test_a_bad_cluster_file_names_the_key(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text("hosts:\n  a: {gpus: 2xv100-17gb}\n")
    with pytest.raises(ClusterFileError, match=r"hosts\.a\.gpus"):
        load_cluster_file(path)
    path.write_text("hosts:\n  a: {gpu: v100-16gb}\n")
    with pytest.raises(ClusterFileError, match=r"hosts\.a\.gpu"):
        load_cluster_file(path)


def test_plan_cluster_command_shows_the_host_of_each_decision(zoo: Path, tmp_path: Path) -> None:
    (tmp_path / "cluster.yaml").write_text("hosts:\n  dgx: {gpus: 2xv100-32gb, address: 10.0.0.2}\n"
                                           "  ws: {gpus: v100-16gb}\n")  # fmt: skip
    (tmp_path / "voltgate.yaml").write_text(
        "models:\n"
        f"  - {{name: chat, sources: [{{hf: {zoo}/llama2-7b}}]}}\n"
        f"  - {{name: side, sources: [{{gguf: {zoo}/llama2-7b.Q8_0.gguf}}], hosts: [ws]}}\n"
    )
    args = ["plan", "--config", str(tmp_path / "voltgate.yaml"), "--cluster", str(tmp_path / "cluster.yaml")]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {d["model"]: d["host"] for d in data["decisions"]} == {"chat": "dgx", "side": "ws"}
    assert [h["address"] for h in data["hosts"]] == ["10.0.0.2", None]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0, text.output
    assert "host dgx at 10.0.0.2" in text.stdout and "host ws" in text.stdout


def test_every_host_tried_is_in_considered_not_only_the_one_that_took_it(zoo: Path) -> None:
    """Issue 35: `considered` listed only the hosts a model was placed on or barred from; a bigger host that
    could not hold it wholly on GPUs was missing, so nobody could tell it had been tried."""
    report = plan(zoo, [host("a", "v100-16gb"), host("b", "v100-16gb")],
                  {"name": "m", "sources": [{"gguf": "llama2-70b.Q4_K_M.gguf"}]})  # fmt: skip
    d = report.decision("m")
    assert d.host in ("a", "b") and {c.host for c in d.considered} == {"a", "b"}, d.considered
    assert any(c.outcome.startswith("not wholly on GPUs") for c in d.considered), d.considered


def test_a_models_replicas_are_spread_over_the_hosts_it_may_run_on(zoo: Path) -> None:
    """Config `replicas`: two replicas over two hosts, one on each (losing a host loses one); four over two, two
    on each (apart across each host's GPUs); on CPU-only hosts too."""
    model = {"name": "m", "sources": [{"hf": "llama2-7b"}], "context": 1024, "engine": "lmdeploy"}
    for gpus, replicas, each in (("2xv100-32gb", 2, 1), ("2xv100-32gb", 4, 2)):
        report = plan(zoo, [host("a", gpus), host("b", gpus)], {**model, "replicas": replicas})
        hosts = [d.host for d in report.decisions]
        assert sorted(hosts) == ["a"] * each + ["b"] * each, hosts
    small = {"name": "s", "sources": [{"gguf": "llama2-7b.Q4_K_M.gguf"}], "context": 512, "replicas": 2}
    cpu = plan(zoo, [host("a", "none"), host("b", "none")], small)
    assert sorted(d.host for d in cpu.decisions) == ["a", "b"]
