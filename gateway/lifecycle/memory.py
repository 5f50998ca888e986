"""Memory as the residency manager sees it: pools with budgets, what each model needs in them (estimated by
placement, then measured), and the probes that measure (NVML on GPUs, /proc on the host).

Pools are named `host` (RAM) and `gpu<index>`. A pool's budget is what placement planned with: the host's
`server.memory_budget_bytes` (default 80 % of MemAvailable at start), a GPU's free memory at start less the
1 GiB margin. A pool may also have a live reading (MemAvailable now, NVML's free memory now less the margin):
a load must fit both, so memory taken by something the gateway does not know about is respected too.

What a model takes is measured once it is READY: on a GPU, NVML's used memory after the load minus before
(loads run one at a time, so the difference is that model's); on the host, the resident set (VmRSS) of the
worker's process group. A measurement, once there is one, replaces the estimate in every later decision.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.placement.estimate import MARGIN_BYTES, MemoryEstimate
from gateway.placement.inventory import GIB, Inventory, host_available_bytes, host_budget_bytes

log = logging.getLogger("voltgate.residency")

HOST = "host"


def gpu_pool(index: int) -> str:
    return f"gpu{index}"


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def pool_label(pool: str) -> str:
    """`host memory` / `GPU 0`, for messages."""
    return "host memory" if pool == HOST else f"GPU {pool.removeprefix('gpu')}"


class MemoryProbe(Protocol):
    """Live memory readings; None where there is nothing to read (no NVML, no /proc)."""

    def gpu_used_bytes(self, index: int) -> int | None: ...

    def gpu_free_bytes(self, index: int) -> int | None: ...

    def host_available_bytes(self) -> int | None: ...

    def group_rss_bytes(self, pgid: int) -> int | None:
        """Resident memory of every process in the process group `pgid` (a worker and what it spawned)."""
        ...


class NoProbe:
    """No live readings at all (in-process tests, or a host whose memory should only be budgeted)."""

    def gpu_used_bytes(self, index: int) -> int | None:
        del index
        return None

    def gpu_free_bytes(self, index: int) -> int | None:
        del index
        return None

    def host_available_bytes(self) -> int | None:
        return None

    def group_rss_bytes(self, pgid: int) -> int | None:
        del pgid
        return None


class SystemProbe:
    """NVML for GPUs (only when placement read them from NVML: a simulated layout has nothing to read) and
    /proc for the host. Every failure reads as None, never as an error."""

    def __init__(self, *, gpus: bool) -> None:
        self._nvml: Any = None
        if gpus:
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml = pynvml
            except Exception:  # no driver or library: no live GPU readings
                self._nvml = None

    def _memory(self, index: int) -> Any:
        if self._nvml is None:
            return None
        try:
            return self._nvml.nvmlDeviceGetMemoryInfo(self._nvml.nvmlDeviceGetHandleByIndex(index))
        except Exception:  # a GPU that cannot be read is treated as unknown
            return None

    def gpu_used_bytes(self, index: int) -> int | None:
        memory = self._memory(index)
        return int(memory.used) if memory is not None else None

    def gpu_free_bytes(self, index: int) -> int | None:
        memory = self._memory(index)
        return int(memory.free) if memory is not None else None

    def host_available_bytes(self) -> int | None:
        return host_available_bytes()

    def group_rss_bytes(self, pgid: int) -> int | None:
        total, found = 0, False
        with contextlib.suppress(OSError):
            for entry in os.scandir("/proc"):
                if not entry.name.isdigit():
                    continue
                rss = _rss_in_group(int(entry.name), pgid)
                if rss is not None:
                    total, found = total + rss, True
        return total if found else None


def _rss_in_group(pid: int, pgid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
        if int(fields[2]) != pgid:  # fields after the name: state, ppid, pgrp, ...
            return None
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class ModelMemory:
    """What one model takes, per pool: placement's estimate and, once it has been loaded, the measurement."""

    estimated: dict[str, int] = field(default_factory=dict)
    measured: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_estimate(cls, estimate: MemoryEstimate | None) -> ModelMemory:
        if estimate is None:
            return cls()
        pools = {gpu_pool(i): n for i, n in estimate.gpu_bytes.items() if n}
        if estimate.host_bytes:
            pools[HOST] = estimate.host_bytes
        return cls(estimated=pools)

    @property
    def gpu_indices(self) -> list[int]:
        return sorted(int(p.removeprefix("gpu")) for p in self.estimated if p != HOST)

    def need(self) -> dict[str, int]:
        """Per pool: the measurement where there is one, else the estimate."""
        pools = {*self.estimated, *self.measured}
        return {pool: self.measured.get(pool, self.estimated.get(pool, 0)) for pool in pools}

    def source(self, pool: str) -> str:
        return "measured" if pool in self.measured else "estimated"

    def describe(self) -> str:
        """`host 0.19 GiB measured, GPU 0 9.34 GiB estimated`."""
        need = self.need()
        parts = [f"{pool_label(p).removesuffix(' memory')} {gib(n)} {self.source(p)}" for p, n in sorted(need.items())]
        return ", ".join(parts) or "nothing known"


@dataclass
class Pools:
    """Budgets per pool (None: unbounded) and the live probe."""

    budgets: dict[str, int | None]
    probe: MemoryProbe
    live_gpus: bool = False

    @classmethod
    def from_inventory(cls, inventory: Inventory | None, host_budget: int | None, probe: MemoryProbe | None) -> Pools:
        budgets: dict[str, int | None] = {HOST: host_budget_bytes(host_budget)}
        for gpu in inventory.gpus if inventory is not None else ():
            budgets[gpu_pool(gpu.index)] = max(0, gpu.free_bytes - MARGIN_BYTES)
        live = inventory is not None and inventory.source == "nvml"
        return cls(budgets, probe if probe is not None else SystemProbe(gpus=live), live_gpus=live)

    def summary(self, resident: list[ModelMemory]) -> dict[str, dict[str, int | None]]:
        """Per pool: the budget, what `resident` holds (measured or estimated), what is free, live free."""
        out: dict[str, dict[str, int | None]] = {}
        for pool, budget in sorted(self.budgets.items()):
            held = sum(m.need().get(pool, 0) for m in resident)
            out[pool] = {
                "budget_bytes": budget,
                "held_bytes": held,
                "free_bytes": None if budget is None else budget - held,
                "live_free_bytes": self.live_free(pool),
            }
        return out

    def live_free(self, pool: str) -> int | None:
        """Free memory in the pool right now (a GPU's less the margin), or None where it cannot be read."""
        if pool == HOST:
            return self.probe.host_available_bytes()
        if not self.live_gpus:
            return None
        free = self.probe.gpu_free_bytes(int(pool.removeprefix("gpu")))
        return None if free is None else max(0, free - MARGIN_BYTES)

    def gpu_used(self, indices: list[int]) -> dict[int, int]:
        if not self.live_gpus:
            return {}
        used = {i: self.probe.gpu_used_bytes(i) for i in indices}
        return {i: n for i, n in used.items() if n is not None}

    def measure(self, memory: ModelMemory, pid: int | None, gpu_before: dict[int, int] | None = None) -> None:
        """Record what a READY worker really takes: on each GPU read before its load (`gpu_before`), NVML's
        used memory now minus then; on the host, its process group's VmRSS (the largest seen so far)."""
        if gpu_before:
            for index, used in self.gpu_used(list(gpu_before)).items():
                memory.measured[gpu_pool(index)] = max(0, used - gpu_before[index])
        rss = self.probe.group_rss_bytes(pid) if pid is not None else None
        if rss is not None:
            memory.measured[HOST] = max(rss, memory.measured.get(HOST, 0))


def estimates_from_placement(placement: Mapping[str, Any]) -> tuple[Inventory | None, dict[str, MemoryEstimate]]:
    """The inventory and each model's memory estimate from a placement report's JSON (as `/v1/placement`
    serves it); both absent when the app was built without one."""
    inventory = None
    if isinstance(placement.get("inventory"), dict):
        inventory = Inventory.model_validate(placement["inventory"])
    estimates: dict[str, MemoryEstimate] = {}
    for decision in placement.get("decisions") or ():
        raw = decision.get("estimate") if isinstance(decision, dict) else None
        if isinstance(raw, dict) and decision.get("plan") is not None:
            fields = {k: v for k, v in raw.items() if k != "terms_gib"}  # computed on output only
            estimates[str(decision["model"])] = MemoryEstimate.model_validate(fields)
    return inventory, estimates
