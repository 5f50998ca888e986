"""Every Prometheus metric the gateway exports, on an injected registry (no import-time globals).

Names follow vLLM/LMDeploy's style with a `voltgate:` prefix; labels are bounded (model, engine, code).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.ops.activity import Activity
from gateway.ops.live_speed import LiveSpeed
from gateway.placement.performance import Prediction

log = logging.getLogger("voltgate.metrics")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)
TTFT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80)
LOAD_BUCKETS = (0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 240, 480, 900)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5)


class GpuCollector(Collector):
    """Per-GPU memory and utilisation read from NVML at scrape time; no GPUs or no driver = no series."""

    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # no driver, no library: a CPU-only host exports no GPU series
            self._nvml = None

    def collect(self) -> Iterable[GaugeMetricFamily]:
        if self._nvml is None:
            return []
        nvml = self._nvml
        used = GaugeMetricFamily("voltgate:gpu_memory_used_bytes", "GPU memory in use", labels=["gpu", "name"])
        total = GaugeMetricFamily("voltgate:gpu_memory_total_bytes", "GPU memory in total", labels=["gpu", "name"])
        util = GaugeMetricFamily("voltgate:gpu_utilization_ratio", "GPU busy fraction (0-1)", labels=["gpu", "name"])
        with contextlib.suppress(Exception):
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                name = nvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else str(name)
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                used.add_metric([str(i), name], float(mem.used))
                total.add_metric([str(i), name], float(mem.total))
                util.add_metric([str(i), name], nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
        return [used, total, util]


class LiveSpeedCollector(Collector):
    """Each model's measured speed over its live window (`gateway.ops.live_speed`), computed at scrape time; a
    model with no measurement yet has no series."""

    def __init__(self, live: LiveSpeed) -> None:
        self._live = live

    def collect(self) -> Iterable[GaugeMetricFamily]:
        decode = GaugeMetricFamily(
            "voltgate:measured_decode_tokens_per_second",
            "Decode tokens/s per stream, p50 of the model's last streamed requests",
            labels=["model"],
        )
        ttft = GaugeMetricFamily(
            "voltgate:measured_ttft_seconds",
            "Admission to first generated token, p50 of the model's last streamed requests",
            labels=["model"],
        )
        for model, (decode_p50, ttft_p50) in sorted(self._live.medians().items()):
            if decode_p50 is not None:
                decode.add_metric([model], decode_p50)
            if ttft_p50 is not None:
                ttft.add_metric([model], ttft_p50)
        return [decode, ttft]


class Metrics:
    """The gateway's metrics. Call sites use the methods, never the prometheus objects directly."""

    def __init__(
        self, registry: CollectorRegistry | None = None, *, gpu: bool = True, live: LiveSpeed | None = None
    ) -> None:
        # One `*_created` gauge per series doubles the scrape for nothing a dashboard uses (vLLM does the same).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self._request_series(r)
        self._worker_series(r)
        self._residency_series(r)
        self._speed_series(r)
        self._prefix_series(r)
        self.live = live if live is not None else LiveSpeed()  # measured speed, per model
        r.register(LiveSpeedCollector(self.live))
        self.activity = Activity()  # recent errors and a speed history, for the status page (`gateway.ops.status`)
        if gpu:
            r.register(GpuCollector())

    # The catalogue, one declaration per metric (docs/metrics.md and the Grafana dashboard list them all; tested).
    def _request_series(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "voltgate:requests",
            "Finished requests by model and outcome",
            ["model", "endpoint", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "voltgate:e2e_request_latency_seconds", "End-to-end request latency", ["model"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "voltgate:time_to_first_token_seconds", "Time to first streamed token", ["model"],
            buckets=TTFT_BUCKETS, registry=r,
        )  # fmt: skip
        self.itl = Histogram(
            "voltgate:inter_token_latency_seconds", "Time between streamed chunks", ["model"],
            buckets=ITL_BUCKETS, registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter("voltgate:prompt_tokens", "Prompt tokens processed", ["model"], registry=r)
        self.generation_tokens = Counter("voltgate:generation_tokens", "Tokens generated", ["model"], registry=r)
        self.queue_depth = Gauge("voltgate:num_requests_waiting", "Requests waiting for a slot", ["model"], registry=r)
        self.running = Gauge("voltgate:num_requests_running", "Requests being served", ["model"], registry=r)
        self.queue_time = Histogram(
            "voltgate:request_queue_time_seconds", "Time spent waiting for a slot", ["model"],
            buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip

    def _worker_series(self, r: CollectorRegistry) -> None:
        self.worker_state = Gauge(
            "voltgate:worker_state",
            "1 for the worker's current state",
            ["model", "engine", "state"],
            registry=r,
        )
        self.worker_restarts = Counter("voltgate:worker_restarts", "Worker restarts", ["model"], registry=r)
        self.worker_crashes = Counter(
            "voltgate:worker_crashes", "Worker exits and failed starts by cause (SIGSEGV, exit 1, timeout)",
            ["model", "cause"], registry=r,
        )  # fmt: skip
        self.slots_busy = Gauge("voltgate:worker_slots_busy", "Worker sequences in use", ["model"], registry=r)
        self.slots_total = Gauge("voltgate:worker_slots", "Worker sequence slots", ["model"], registry=r)
        self.kv_cells_used = Gauge("voltgate:worker_kv_cells_used", "KV-cache cells in use", ["model"], registry=r)
        self.kv_cells_total = Gauge("voltgate:worker_kv_cells", "KV-cache cells in total", ["model"], registry=r)
        self.worker_tps = Gauge(
            "voltgate:worker_generation_tokens_per_second", "Recent decode throughput", ["model"], registry=r
        )
        self.rejections = Counter(
            "voltgate:rejected_requests",
            "Requests refused before reaching a worker",
            ["model", "code"],
            registry=r,
        )

    def _residency_series(self, r: CollectorRegistry) -> None:
        self.model_loads = Counter(
            "voltgate:model_loads", "Loads of on-demand models (outcome: ok, failed)", ["model", "outcome"], registry=r
        )
        self.model_evictions = Counter(
            "voltgate:model_evictions",
            "On-demand models unloaded, by reason (idle, memory, admin)",
            ["model", "reason"],
            registry=r,
        )
        self.load_duration = Histogram(
            "voltgate:model_load_duration_seconds", "Start of a load to its worker being ready", ["model"],
            buckets=LOAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.load_wait = Histogram(
            "voltgate:model_load_wait_seconds", "Time requests waited for their model to be loaded", ["model"],
            buckets=LOAD_BUCKETS, registry=r,
        )  # fmt: skip
        self.model_state = Gauge(
            "voltgate:model_state", "1 for the model's residency state", ["model", "state"], registry=r
        )
        self.model_memory = Gauge(
            "voltgate:model_memory_bytes",
            "Memory a model takes per pool (host, gpu<i>): estimated by placement, measured after its load",
            ["model", "pool", "kind"],
            registry=r,
        )

    def _speed_series(self, r: CollectorRegistry) -> None:
        self.predicted_decode = Gauge(
            "voltgate:predicted_decode_tokens_per_second",
            "The plan's decode tokens/s per stream, with 1 stream and with the plan's sessions decoding",
            ["model", "streams"],
            registry=r,
        )
        self.predicted_ttft = Gauge(
            "voltgate:predicted_ttft_seconds", "The plan's time to first token for a 512-token prompt", ["model"],
            registry=r,
        )  # fmt: skip

    def _prefix_series(self, r: CollectorRegistry) -> None:
        self.replica_picks = Counter(
            "voltgate:replica_picks",
            "Requests sent to each replica of a model, by why (session, prefix or load: gateway.serving.replicas)",
            ["model", "replica", "reason"],
            registry=r,
        )
        self.replica_retries = Counter(
            "voltgate:replica_retries",
            "Requests sent again to another replica because `from_replica`'s worker answered nothing (reason: "
            "connect, reset, lost or not_ready: gateway.serving.upstream.Unanswered)",
            ["model", "from_replica", "reason"],
            registry=r,
        )
        self.prompt_neutralised = Counter(
            "voltgate:prompt_neutralised",
            "Requests whose volatile client bytes a rule took out of the prompt (gateway.serving.prompt_prefix)",
            ["model", "rule"],
            registry=r,
        )
        self.prompt_tokens_cached = Counter(
            "voltgate:prompt_tokens_cached",
            "Prompt tokens the engine served from its prefix cache (engines that report it: not LMDeploy)",
            ["model"],
            registry=r,
        )
        self.prompt_tokens_reported = Counter(
            "voltgate:prompt_tokens_cache_reported",
            "Prompt tokens of the requests whose engine said how many it served from cache (the hit share's base)",
            ["model"],
            registry=r,
        )
        self.prefill_saved = Counter(
            "voltgate:prefill_seconds_saved",
            "Prefill seconds the cached prompt tokens did not cost, at the model's measured prefill speed",
            ["model"],
            registry=r,
        )

    def prefix_cache(self, model: str) -> tuple[float | None, float]:
        """Since the start: the share of the model's reported prompt tokens served from its prefix cache (None
        before a request whose engine reported it), and the prefill seconds that saved."""
        value = self.registry.get_sample_value
        reported = value("voltgate:prompt_tokens_cache_reported_total", {"model": model}) or 0.0
        cached = value("voltgate:prompt_tokens_cached_total", {"model": model}) or 0.0
        saved = value("voltgate:prefill_seconds_saved_total", {"model": model}) or 0.0
        return (cached / reported if reported else None), saved

    def count_cached(self, model: str, prompt_tokens: int, cached_tokens: int | None) -> None:
        """One request's prefix-cache hit (None: its engine does not say; nothing counted). The seconds saved
        are `LiveSpeed.prefill_seconds` of the cached tokens (docs/metrics.md, "Prefix cache")."""
        if cached_tokens is None:
            return
        cached = min(cached_tokens, prompt_tokens)
        self.prompt_tokens_reported.labels(model).inc(prompt_tokens)
        self.prompt_tokens_cached.labels(model).inc(cached)
        seconds = self.live.prefill_seconds(model, cached) if cached else 0.0
        self.prefill_saved.labels(model).inc(seconds or 0.0)

    def set_worker_state(self, model: str, engine: str, state: str, states: Sequence[str]) -> None:
        for s in states:
            self.worker_state.labels(model, engine, s).set(1.0 if s == state else 0.0)

    def set_model_state(self, model: str, state: str, states: Sequence[str]) -> None:
        for s in states:
            self.model_state.labels(model, s).set(1.0 if s == state else 0.0)

    def update_worker_stats(self, model: str, health: dict[str, Any]) -> None:
        """Feed the worker's own /health counters (slots, KV cells, tokens/s) into gateway series."""
        for gauge, key in (
            (self.slots_busy, "slots_busy"),
            (self.slots_total, "slots"),
            (self.kv_cells_used, "kv_cells_used"),
            (self.kv_cells_total, "kv_cells_total"),
            (self.worker_tps, "tokens_per_second"),
        ):
            value = health.get(key)
            if isinstance(value, int | float):
                gauge.labels(model).set(float(value))

    def set_predictions(self, predictions: Mapping[str, Prediction]) -> None:
        """The plans' predicted speeds, per served model: exported, and set against the measured ones."""
        for model, prediction in predictions.items():
            self.predicted_decode.labels(model, "1").set(prediction.decode_tok_s_1)
            if prediction.sessions > 1:
                self.predicted_decode.labels(model, str(prediction.sessions)).set(prediction.decode_tok_s_per_stream)
            self.predicted_ttft.labels(model).set(prediction.ttft_s)
        self.live.predictions.update(predictions)

    def render(self) -> bytes:
        return generate_latest(self.registry)
