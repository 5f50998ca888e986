"""Which models to unload so that another fits, and the sentences that say why (or why nothing can).

Pure decisions over the models in memory (`Tenant`) and the pools (`gateway.lifecycle.memory.Pools`); the residency
manager acts on them. A model fits in a pool when its need (measured, else estimated) is at most both what
the budget leaves beside everyone else in memory and what the pool has free right now (where that can be
read), counting what the chosen victims would give back. Victims are on-demand models that are READY:
idle ones first, least recently used first, then busy ones (which the manager drains, never kills).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, TypeVar

from gateway.lifecycle.memory import ModelMemory, Pools, gib, pool_label

Shortfall = dict[str, tuple[int, int]]
"""Per pool where a model does not fit: (needed, free) bytes."""


class Tenant(Protocol):
    """A model as these decisions see it."""

    @property
    def name(self) -> str: ...

    @property
    def evictable(self) -> bool: ...

    @property
    def memory(self) -> ModelMemory: ...

    @property
    def holds(self) -> int: ...

    @property
    def last_used(self) -> float | None: ...


T = TypeVar("T", bound=Tenant)


def shortfall(pools: Pools, tenant: Tenant, residents: Sequence[Tenant], victims: Sequence[Tenant] = ()) -> Shortfall:
    """Where `tenant` would not fit beside `residents` (the models in memory, itself excluded) once
    `victims` (some of those residents, still in memory) are gone."""
    short: Shortfall = {}
    staying = [r for r in residents if r is not tenant and all(r is not v for v in victims)]
    for pool, need in tenant.memory.need().items():
        free: int | None = None
        budget = pools.budgets.get(pool)
        if budget is not None:
            free = budget - sum(r.memory.need().get(pool, 0) for r in staying)
        live = pools.live_free(pool)
        if live is not None:
            live += sum(v.memory.need().get(pool, 0) for v in victims)
            free = live if free is None else min(free, live)
        if free is not None and need > free:
            short[pool] = (need, free)
    return short


def choose_victims(
    pools: Pools, tenant: Tenant, residents: Sequence[Tenant], candidates: Sequence[T]
) -> tuple[list[T], Shortfall]:
    """The fewest candidates, in eviction order (idle before busy, least recently used first), that make
    `tenant` fit; with what would still be missing if even all of them do not (then no victim is worth
    unloading: the returned shortfall is not empty)."""
    short = shortfall(pools, tenant, residents)
    victims: list[T] = []
    for candidate in sorted(candidates, key=lambda c: (c.holds > 0, c.last_used or 0.0)):
        if not short:
            break
        if any(candidate.memory.need().get(pool) for pool in short):
            victims.append(candidate)
            short = shortfall(pools, tenant, residents, victims)
    return victims, short


def eviction_reason(victim: Tenant, tenant: Tenant) -> str:
    """Why `victim` is unloaded, for the log: how idle it was, what it takes and what `tenant` needs."""
    if victim.holds:  # logged once they are drained: the model is unloaded only after they finish
        use = f"busy with {victim.holds} request(s), unloaded after they finished"
    elif victim.last_used is not None:
        use = f"idle {time.monotonic() - victim.last_used:.0f} s"
    else:
        use = "never used"
    return (
        f"least recently used ({use}), it takes {victim.memory.describe()}; "
        f"{tenant.name!r} needs {tenant.memory.describe()}"
    )


def no_room(pools: Pools, tenant: Tenant, residents: Sequence[Tenant], short: Shortfall) -> str:
    """Why `tenant` cannot be loaded even with every other on-demand model unloaded, with the numbers."""
    parts = []
    for pool, (need, free) in sorted(short.items()):
        budget = pools.budgets.get(pool)
        pinned = [r for r in residents if not r.evictable and r is not tenant and r.memory.need().get(pool)]
        held = ", ".join(f"{r.name!r} {gib(r.memory.need()[pool])}" for r in pinned) or "none"
        live = pools.live_free(pool)
        parts.append(
            f"{pool_label(pool)}: needs {gib(need)} ({tenant.memory.source(pool)}), at most {gib(max(0, free))} "
            f"can be had after unloading every other on-demand model (budget "
            f"{gib(budget) if budget is not None else 'unbounded'}; pinned models hold {held}"
            + (f"; {gib(live)} free now" if live is not None else "")
            + ")"
        )
    return f"model {tenant.name!r} cannot be loaded: " + "; ".join(parts)
