"""What the status page (`/ui`, docs/status-page.md) shows, in one typed report: `GET /ui/api/status`.

Built from what the gateway already keeps: the registry and residency (each model's state, requests, memory
estimated and measured), the placement report (engine, quant, GPUs, predicted speed, the GPU inventory),
the live speed window (measured speed) and `gateway.ops.activity` (recent errors, the speed history).

What a caller sees follows its key: a key with a model allow-list sees only those models; recent errors are
every caller's for an admin (and in open mode), otherwise only the caller's own key's.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from backends.base import EngineName
from gateway import __version__
from gateway.lifecycle.deployments import Deployment, Registry
from gateway.lifecycle.memory import HOST, gpu_pool, on_host
from gateway.lifecycle.residency import Residency
from gateway.lifecycle.workers import Status
from gateway.ops.activity import BIN_S, ErrorEvent, SpeedBin
from gateway.ops.auth import Principal
from gateway.ops.metrics import Metrics

IN_MEMORY = (Status.READY.value, Status.LOADING.value, Status.DRAINING.value)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolMemory(_Out):
    pool: str  # host, gpu<i>
    estimated_bytes: int | None
    measured_bytes: int | None


class ModelStatus(_Out):
    name: str
    replica_of: str | None  # `m` for its replica `m@2` (config `replicas`): shown under its model
    aliases: list[str]
    engine: str
    quant: str | None
    task: str
    load: str
    state: str  # unloaded, loading, ready, draining, failed
    reason: str | None  # why it failed
    progress: str | None  # what a loading model is doing
    host: str  # local, or a remote endpoint's URL
    cluster_host: str | None  # the cluster host it is served on (`serve --cluster`)
    gpus: list[int]
    memory: list[PoolMemory]
    in_flight: int
    queued: int
    running: int
    predicted_tok_s: float | None  # one stream, decode
    measured_tok_s: float | None  # p50 per stream over the live window
    predicted_ttft_s: float | None
    measured_ttft_s: float | None
    prefix_hit_share: float | None  # of the prompt tokens since the start, served from the prefix cache (None:
    # no request yet whose engine reports it; LMDeploy never does, docs/api.md "Cached tokens")
    prefill_saved_s: float  # prefill seconds the cache saved since the start (docs/metrics.md, "Prefix cache")
    thinking_tokens: int | None  # most tokens the model's reasoning default thinks first (None: unbounded)
    predicted_answer_s: float | None  # time to the first answer token: the TTFT plus that thinking


class RefusedModel(_Out):
    name: str
    reason: str


class PoolUse(_Out):
    model: str
    bytes: int
    measured: bool


class PoolStatus(_Out):
    """One memory pool as a bar: `total_bytes` = `reserved_bytes` (margin, other processes) + used + free."""

    pool: str
    kind: Literal["gpu", "host"]
    label: str
    host: str
    simulated: bool
    total_bytes: int
    reserved_bytes: int
    used: list[PoolUse]
    free_bytes: int


class SpeedSample(_Out):
    age_s: float
    requests: int
    tok_s: float
    ttft_p50_s: float | None


class RecentError(_Out):
    at: str
    request_id: str
    model: str
    endpoint: str
    status: int
    code: str | None
    message: str | None
    key_id: str | None


class StatusReport(_Out):
    version: str
    open_mode: bool
    admin: bool
    key_id: str
    accepting: bool
    models: list[ModelStatus]
    refused: list[RefusedModel]
    pools: list[PoolStatus]
    speed: list[SpeedSample]
    speed_bin_s: float
    errors: list[RecentError]


def status_report(
    registry: Registry,
    residency: Residency,
    metrics: Metrics,
    placement: Mapping[str, Any],
    *,
    principal: Principal,
    admin: bool,
    open_mode: bool,
    accepting: bool,
) -> StatusReport:
    visible = [d for d in registry if _visible(principal, d)]
    described = {d.name: residency.describe(d) for d in registry}
    on_hosts = (
        {str(d["model"]): d.get("host") for d in placement.get("decisions") or ()} if placement.get("cluster") else {}
    )
    models = [_model(d, described[d.name], metrics, on_hosts.get(d.name)) for d in visible]
    errors = [e for e in metrics.activity.errors() if admin or open_mode or e.key_id == principal.key_id]
    return StatusReport(
        version=__version__,
        open_mode=open_mode,
        admin=admin,
        key_id=principal.key_id,
        accepting=accepting,
        models=models,
        refused=[RefusedModel(name=n, reason=r) for n, r in sorted(registry.refused.items())],
        pools=_pools(placement, residency, described),
        speed=[_sample(b) for b in metrics.activity.series()],
        speed_bin_s=BIN_S,
        errors=[_error(e) for e in errors],
    )


def _visible(principal: Principal, deployment: Deployment) -> bool:
    allowed = principal.models
    name = deployment.replica_of or deployment.name  # a replica is seen by whoever may use its model
    return not allowed or name in allowed or bool(set(deployment.aliases) & set(allowed))


def _model(
    deployment: Deployment, described: Mapping[str, Any], metrics: Metrics, cluster_host: str | None
) -> ModelStatus:
    plan = deployment.plan
    prediction = metrics.live.predictions.get(deployment.name)
    decode, ttft = metrics.live.medians().get(deployment.name, (None, None))
    hit_share, saved_s = metrics.prefix_cache(deployment.name)
    thinking = deployment.reasoning.thinking_tokens()
    memory = [
        PoolMemory(pool=pool, estimated_bytes=m.get("estimated_bytes"), measured_bytes=m.get("measured_bytes"))
        for pool, m in sorted((described.get("memory") or {}).items())
    ]
    return ModelStatus(
        name=deployment.name,
        replica_of=deployment.replica_of,
        aliases=list(deployment.aliases),
        engine=plan.engine.value,
        quant=plan.quant or (plan.dtype if plan.engine is EngineName.LMDEPLOY else None),
        task=plan.task,
        load=deployment.load,
        state=str(described["state"]),
        reason=(described.get("error") or deployment.worker.last_error) if described["state"] == "failed" else None,
        progress=described.get("progress"),
        host="local" if plan.remote_url is None else plan.remote_url,
        cluster_host=cluster_host,
        gpus=list(plan.gpu_indices),
        memory=memory,
        in_flight=int(described["in_flight"]),
        queued=deployment.admission.waiting + int(described["waiting"]),
        running=deployment.admission.running,
        predicted_tok_s=round(prediction.decode_tok_s_1, 1) if prediction else None,
        measured_tok_s=None if decode is None else round(decode, 1),
        predicted_ttft_s=round(prediction.ttft_s, 4) if prediction else None,
        measured_ttft_s=None if ttft is None else round(ttft, 4),
        prefix_hit_share=None if hit_share is None else round(hit_share, 4),
        prefill_saved_s=round(saved_s, 3),
        thinking_tokens=thinking,
        predicted_answer_s=round(prediction.answer_after_s(thinking), 4) if prediction and thinking else None,
    )


def _pools(
    placement: Mapping[str, Any], residency: Residency, described: Mapping[str, Mapping[str, Any]]
) -> list[PoolStatus]:
    """A bar per GPU of the placement's inventory, and one for host memory when its budget is known; on a
    cluster (`serve --cluster`), those of every live host, each pool named and labelled with its host."""
    budgets = residency.budgets()
    if not placement.get("cluster"):
        return _host_pools(placement.get("inventory") or {}, None, budgets, described)
    return [
        pool
        for entry in placement.get("hosts") or ()
        for pool in _host_pools(entry["report"].get("inventory") or {}, str(entry["host"]), budgets, described)
    ]


def _host_pools(
    inventory: Mapping[str, Any],
    host: str | None,
    budgets: Mapping[str, Mapping[str, int | None]],
    described: Mapping[str, Mapping[str, Any]],
) -> list[PoolStatus]:
    """The bars of one host (`host` None: the gateway's own), from its inventory and the residency's budgets."""
    pools = []
    suffix = "" if host is None else f" · host {host}"
    for gpu in inventory.get("gpus") or ():
        pool = on_host(host, gpu_pool(int(gpu["index"])))
        total = int(gpu["total_bytes"])
        budget = budgets.get(pool, {}).get("budget_bytes")
        label = f"GPU {gpu['index']} · {gpu['name']}{suffix}"
        reserved = total - budget if budget is not None else total - int(gpu["free_bytes"])
        simulated = bool(gpu.get("simulated"))
        pools.append(_pool(pool, "gpu", label, host, total, max(0, reserved), described, simulated))
    pool = on_host(host, HOST)
    host_budget = budgets.get(pool, {}).get("budget_bytes")
    if host_budget is not None:
        total = int(inventory.get("host_memory_bytes") or host_budget)
        reserved = max(0, total - host_budget)
        pools.append(_pool(pool, "host", "host memory" + suffix, host, total, reserved, described, False))
    return pools


def _pool(
    pool: str,
    kind: Literal["gpu", "host"],
    label: str,
    host: str | None,
    total: int,
    reserved: int,
    described: Mapping[str, Mapping[str, Any]],
    simulated: bool,
) -> PoolStatus:
    used = []
    for name, d in described.items():
        memory = (d.get("memory") or {}).get(pool) or {}
        held = memory.get("measured_bytes") or memory.get("estimated_bytes")
        if d["state"] in IN_MEMORY and held:
            used.append(PoolUse(model=name, bytes=int(held), measured=memory.get("measured_bytes") is not None))
    free = max(0, total - reserved - sum(u.bytes for u in used))
    return PoolStatus(pool=pool, kind=kind, label=label, host=host or "local", simulated=simulated, total_bytes=total,
                      reserved_bytes=reserved, used=used, free_bytes=free)  # fmt: skip


def _error(e: ErrorEvent) -> RecentError:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(e.at))
    return RecentError(at=at, request_id=e.request_id, model=e.model, endpoint=e.endpoint, status=e.status,
                       code=e.code, message=e.message, key_id=e.key_id)  # fmt: skip


def _sample(b: SpeedBin) -> SpeedSample:
    return SpeedSample(age_s=b.age_s, requests=b.requests, tok_s=b.tok_s, ttft_p50_s=b.ttft_p50_s)
