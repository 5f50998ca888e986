"""Residency in the plan: what the pinned set leaves per memory pool, which on-demand models can be loaded
into it (each was placed alone on it), which can share it two at a time, and which never fit.

Pools are `host` (the host memory budget: `server.memory_budget_bytes`, default 80 % of MemAvailable) and
`gpu<i>` (what placement had free on GPU i, less the margin). The numbers here are placement's estimates;
at run time `gateway.lifecycle.residency` decides with measured memory where it has a measurement.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

from gateway.config import ModelSpec
from gateway.placement.estimate import MemoryEstimate, gib
from gateway.placement.report import PlacementReport, ResidencySummary

HOST = "host"


def needs(estimate: MemoryEstimate | None) -> dict[str, int]:
    """A plan's memory per pool (the margin kept free on GPUs is not part of it)."""
    if estimate is None:
        return {}
    pools = {f"gpu{i}": n for i, n in estimate.gpu_bytes.items() if n}
    if estimate.host_bytes:
        pools[HOST] = estimate.host_bytes
    return pools


def plan_residency(
    report: PlacementReport, specs: Sequence[ModelSpec], host_budget: int | None, gpu_left: dict[int, int]
) -> PlacementReport:
    """Mark each placed model resident or swapping; refuse, with numbers, an on-demand model that the
    host budget left by the pinned set cannot hold; list which on-demand models fit beside which."""
    pinned = [d for d in report.decisions if d.load == "always" and d.plan is not None]
    held: dict[str, int] = {}
    for decision in pinned:
        decision.residency = "resident"
        for pool, n in needs(decision.estimate).items():
            held[pool] = held.get(pool, 0) + n
    budgets: dict[str, int | None] = {HOST: host_budget}
    left: dict[str, int | None] = {HOST: None if host_budget is None else host_budget - held.get(HOST, 0)}
    for index, free in gpu_left.items():
        pool = f"gpu{index}"
        budgets[pool], left[pool] = free + held.get(pool, 0), free
    idle = {spec.name: spec.idle_unload_s for spec in specs}
    swapping = []
    for decision in report.decisions:
        if decision.load != "on_demand" or decision.plan is None:
            continue
        short = _short(needs(decision.estimate), left)
        if short:
            decision.plan, decision.prediction = None, None
            decision.refusal = _never(short, budgets, held, left)
            continue
        decision.residency = "swaps"
        ttl = idle.get(decision.model)
        decision.notes.append(
            "loaded by its first request; unloaded when another model needs its memory"
            + (f" or after {ttl:g} s without requests" if ttl is not None else " (no idle_unload_s: never when idle)")
        )
        swapping.append(decision)
    for a, b in combinations(swapping, 2):
        together = _sum(needs(a.estimate), needs(b.estimate))
        if not _short(together, left):
            a.co_resident.append(b.model)
            b.co_resident.append(a.model)
    report.residency = ResidencySummary(budget_bytes=budgets, pinned_bytes=held, left_bytes=left)
    return report


def _sum(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {pool: a.get(pool, 0) + b.get(pool, 0) for pool in {*a, *b}}


def _short(need: dict[str, int], left: dict[str, int | None]) -> dict[str, int]:
    """Pools where `need` exceeds what is left (pools with no known budget never are)."""
    short = {}
    for pool, n in need.items():
        room = left.get(pool)
        if room is not None and n > room:
            short[pool] = n
    return short


def _never(
    short: dict[str, int], budgets: dict[str, int | None], held: dict[str, int], left: dict[str, int | None]
) -> str:
    parts = []
    for pool, n in sorted(short.items()):
        label = "host memory" if pool == HOST else f"GPU {pool.removeprefix('gpu')}"
        parts.append(
            f"needs {gib(n)} of {label} (estimated); the budget is {gib(budgets[pool] or 0)}, the pinned models "
            f"hold {gib(held.get(pool, 0))}, leaving {gib(max(0, left[pool] or 0))}"
        )
    hint = " (raise server.memory_budget_bytes, shorten its context or unpin a model)" if HOST in short else ""
    return "can never be loaded beside the pinned models: " + "; ".join(parts) + hint
