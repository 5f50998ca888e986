"""Metrics: every series under its documented name, bounded labels, GPU series only where NVML sees GPUs."""

from __future__ import annotations

import json
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.lifecycle.workers import WorkerState
from gateway.ops.metrics import GpuCollector, Metrics
from tests.unit.test_live_speed import PREDICTION

# Every sample name the gateway documents (README.md, "Metrics"), without histogram/counter suffixes.
DOCUMENTED = {
    "voltgate:requests": "counter",
    "voltgate:rejected_requests": "counter",
    "voltgate:e2e_request_latency_seconds": "histogram",
    "voltgate:time_to_first_token_seconds": "histogram",
    "voltgate:inter_token_latency_seconds": "histogram",
    "voltgate:request_queue_time_seconds": "histogram",
    "voltgate:prompt_tokens": "counter",
    "voltgate:generation_tokens": "counter",
    "voltgate:num_requests_waiting": "gauge",
    "voltgate:num_requests_running": "gauge",
    "voltgate:worker_state": "gauge",
    "voltgate:worker_restarts": "counter",
    "voltgate:worker_crashes": "counter",
    "voltgate:worker_slots": "gauge",
    "voltgate:worker_slots_busy": "gauge",
    "voltgate:worker_kv_cells_used": "gauge",
    "voltgate:worker_kv_cells": "gauge",
    "voltgate:worker_generation_tokens_per_second": "gauge",
    "voltgate:model_loads": "counter",
    "voltgate:model_evictions": "counter",
    "voltgate:model_load_duration_seconds": "histogram",
    "voltgate:model_load_wait_seconds": "histogram",
    "voltgate:model_state": "gauge",
    "voltgate:model_memory_bytes": "gauge",
    "voltgate:predicted_decode_tokens_per_second": "gauge",
    "voltgate:predicted_ttft_seconds": "gauge",
    "voltgate:measured_decode_tokens_per_second": "gauge",
    "voltgate:measured_ttft_seconds": "gauge",
    "voltgate:prompt_neutralised": "counter",
    "voltgate:replica_picks": "counter",
    "voltgate:replica_retries": "counter",
    "voltgate:prompt_tokens_cached": "counter",
    "voltgate:prompt_tokens_cache_reported": "counter",
    "voltgate:prefill_seconds_saved": "counter",
}
GPU_SERIES = {"voltgate:gpu_memory_used_bytes", "voltgate:gpu_memory_total_bytes", "voltgate:gpu_utilization_ratio"}


def samples(metrics: Metrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(metrics: Metrics, name: str, /, **labels: str) -> float:
    return samples(metrics)[(name, tuple(sorted(labels.items())))]


def exercise(metrics: Metrics) -> None:
    """What one streamed request, one rejection and a worker restart do to the metrics."""
    states = [s.value for s in WorkerState]
    metrics.set_worker_state("m", "llamacpp", "ready", states)
    metrics.worker_restarts.labels("m").inc()
    metrics.requests.labels("m", "chat", "200").inc()
    metrics.rejections.labels("m", "queue_full").inc()
    metrics.latency.labels("m").observe(0.5)
    metrics.ttft.labels("m").observe(0.05)
    metrics.itl.labels("m").observe(0.01)
    metrics.queue_time.labels("m").observe(0.0)
    metrics.prompt_tokens.labels("m").inc(12)
    metrics.generation_tokens.labels("m").inc(8)
    metrics.queue_depth.labels("m").set(0)
    metrics.running.labels("m").set(1)
    metrics.update_worker_stats(
        "m", {"slots": 4, "slots_busy": 1, "kv_cells_used": 40, "kv_cells_total": 4096, "tokens_per_second": 95.5}
    )
    metrics.model_loads.labels("m", "ok").inc()
    metrics.model_evictions.labels("m", "idle").inc()
    metrics.load_duration.labels("m").observe(1.2)
    metrics.load_wait.labels("m").observe(1.1)
    metrics.set_model_state("m", "ready", ["unloaded", "loading", "ready", "draining", "failed"])
    metrics.model_memory.labels("m", "host", "measured").set(2e8)
    metrics.set_predictions({"m": PREDICTION})
    flight = metrics.live.begin("m")
    first = flight.started + 0.01
    metrics.live.end(flight, completed=True, tokens=(12, 8), first_content_at=first, last_chunk_at=first + 0.07)


def test_every_documented_metric_is_exported_with_its_type() -> None:
    metrics = Metrics(gpu=False)
    exercise(metrics)
    families = {f.name: f.type for f in text_string_to_metric_families(metrics.render().decode())}
    assert families == DOCUMENTED


def test_counters_end_in_total_and_carry_bounded_labels() -> None:
    metrics = Metrics(gpu=False)
    exercise(metrics)
    assert value(metrics, "voltgate:requests_total", model="m", endpoint="chat", status="200") == 1
    assert value(metrics, "voltgate:rejected_requests_total", model="m", code="queue_full") == 1
    assert value(metrics, "voltgate:prompt_tokens_total", model="m") == 12
    assert value(metrics, "voltgate:generation_tokens_total", model="m") == 8
    assert value(metrics, "voltgate:worker_restarts_total", model="m") == 1
    assert value(metrics, "voltgate:time_to_first_token_seconds_count", model="m") == 1
    allowed = {"model", "endpoint", "status", "code", "engine", "state", "le", "gpu", "name"}
    allowed |= {"outcome", "reason", "pool", "kind"}  # residency: loads, evictions, memory (all bounded)
    allowed |= {"streams"}  # predicted speed: "1" and the plan's sessions
    for _, labels in samples(metrics):
        assert {k for k, _ in labels} <= allowed


def test_worker_state_is_one_hot() -> None:
    metrics = Metrics(gpu=False)
    states = [s.value for s in WorkerState]
    metrics.set_worker_state("m", "llamacpp", "starting", states)
    metrics.set_worker_state("m", "llamacpp", "ready", states)
    values = {s: value(metrics, "voltgate:worker_state", model="m", engine="llamacpp", state=s) for s in states}
    assert values == {s: (1.0 if s == "ready" else 0.0) for s in states}


def test_worker_health_feeds_slot_and_kv_gauges_and_ignores_junk() -> None:
    metrics = Metrics(gpu=False)
    metrics.update_worker_stats(
        "m", {"slots": 4, "slots_busy": 2, "kv_cells_used": 77, "kv_cells_total": 4096, "tokens_per_second": 12.5}
    )
    metrics.update_worker_stats("m", {"slots_busy": "lots", "kv_cells_used": None, "status": "ok"})
    assert value(metrics, "voltgate:worker_slots", model="m") == 4
    assert value(metrics, "voltgate:worker_slots_busy", model="m") == 2
    assert value(metrics, "voltgate:worker_kv_cells_used", model="m") == 77
    assert value(metrics, "voltgate:worker_kv_cells", model="m") == 4096
    assert value(metrics, "voltgate:worker_generation_tokens_per_second", model="m") == 12.5


def test_separate_instances_do_not_share_a_registry() -> None:
    a, b = Metrics(gpu=False), Metrics(gpu=False)
    a.requests.labels("m", "chat", "200").inc()
    assert ("voltgate:requests_total", (("endpoint", "chat"), ("model", "m"), ("status", "200"))) not in samples(b)


# -- GPUs ------------------------------------------------------------------------------------------------
@dataclass
class _Memory:
    used: int
    total: int


@dataclass
class _Utilization:
    gpu: int


class FakeNvml(types.ModuleType):
    """Stands for `pynvml` (nvidia-ml-py) on a host with two 16 GB V100s."""

    def __init__(self) -> None:
        super().__init__("pynvml")

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        return b"Tesla V100-SXM2-16GB"

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> _Memory:
        return _Memory(used=(handle + 1) * 2**30, total=16 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> _Utilization:
        return _Utilization(gpu=50 * handle)


class NoDriverNvml(FakeNvml):
    """Stands for `pynvml` on a host without an NVIDIA driver: nvmlInit raises."""

    def nvmlInit(self) -> None:
        raise OSError("NVML Shared Library Not Found")


def test_gpu_series_come_from_nvml_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    metrics = Metrics()
    gpu0 = {"gpu": "0", "name": "Tesla V100-SXM2-16GB"}
    gpu1 = {"gpu": "1", "name": "Tesla V100-SXM2-16GB"}
    assert value(metrics, "voltgate:gpu_memory_used_bytes", **gpu0) == 2**30
    assert value(metrics, "voltgate:gpu_memory_used_bytes", **gpu1) == 2 * 2**30
    assert value(metrics, "voltgate:gpu_memory_total_bytes", **gpu1) == 16 * 2**30
    assert value(metrics, "voltgate:gpu_utilization_ratio", **gpu1) == 0.5


def test_no_driver_means_no_gpu_series_and_no_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", NoDriverNvml())
    metrics = Metrics()
    exercise(metrics)
    names = {name for name, _ in samples(metrics)}
    assert not names & GPU_SERIES
    assert "voltgate:requests_total" in names


def test_nvml_failing_at_scrape_time_drops_gpu_samples_only(monkeypatch: pytest.MonkeyPatch) -> None:
    nvml = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    metrics = Metrics()

    def lost(_: int) -> None:
        raise RuntimeError("GPU is lost")

    monkeypatch.setattr(nvml, "nvmlDeviceGetHandleByIndex", lost)
    names = {name for name, _ in samples(metrics)}
    assert not names & GPU_SERIES


def test_this_host_scrapes_without_error() -> None:
    """On the CPU-only CI host the real collector must simply export nothing for GPUs."""
    collector = GpuCollector()
    families = list(collector.collect())
    if collector._nvml is None:
        assert families == []


# -- what operators see ------------------------------------------------------------------------------------
REPO = Path(__file__).resolve().parents[2]
EXPOSED_SUFFIX = {"counter": "_total", "histogram": "", "gauge": ""}


def _base(name: str) -> str:
    return re.sub(r"_(bucket|sum|count|total)$", "", name)


def test_grafana_dashboard_queries_every_metric_and_nothing_else() -> None:
    dashboard = json.loads((REPO / "docker" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    assert exprs
    used = {_base(name) for expr in exprs for name in re.findall(r"voltgate:[a-z0-9_]+", expr)}
    assert used == set(DOCUMENTED) | GPU_SERIES
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


def test_operations_doc_lists_every_metric_under_its_exposed_name() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text()
    for name, kind in DOCUMENTED.items():
        assert f"`{name}{EXPOSED_SUFFIX[kind]}`" in doc, name
    for name in GPU_SERIES:
        assert f"`{name}`" in doc, name
