"""The llama.cpp worker's host prompt cache in the plan: how much host memory it may take, counted in the
estimate and said in the notes (issue 34).

The cache keeps the KV of slots that new prompts overwrite (long prompts, reused prefixes, named sessions:
docs/engines.md), so that an agent's context or a frontend's tools prefix comes back without a prefill. It
is a bound, not a need: the plan gives it the configured size (`llamacpp.prompt_cache_mib`, default
`PROMPT_CACHE_MIB`), cut to half of the host memory the model itself leaves usable, and passes the result to
the worker explicitly, so what the plan shows (`MemoryEstimate.prompt_cache_bytes`) is what the worker may
take. It is kept apart from `host_bytes`: the worker fills it only as states are saved, so the on-demand
models' host budget (`swapping`) does not reserve it.
"""

from __future__ import annotations

from dataclasses import replace

from backends.base import PROMPT_CACHE_MIB, EngineName
from gateway.placement.estimate import gib
from gateway.placement.rungs import HOST_MEMORY_FRACTION, ModelWork, Placed

MIB = 2**20


def with_prompt_cache(work: ModelWork, placed: Placed) -> Placed:
    """`placed` with its prompt cache sized, in the estimate and explained (llama.cpp plans only)."""
    if placed.plan.engine != EngineName.LLAMACPP:
        return placed
    options = placed.plan.llamacpp
    wanted = PROMPT_CACHE_MIB if options.prompt_cache_mib is None else options.prompt_cache_mib
    mib = wanted
    host = work.host_memory_bytes
    if host is not None:
        room = int(host * HOST_MEMORY_FRACTION) - placed.estimate.host_bytes
        mib = max(0, min(wanted, room // 2 // MIB))
    plan = placed.plan.model_copy(update={"llamacpp": options.model_copy(update={"prompt_cache_mib": mib})})
    estimate = placed.estimate.model_copy(update={"prompt_cache_bytes": mib * MIB})
    if mib == 0:
        note = "host prompt cache off" + (" (no host memory left for it)" if wanted else "")
    else:
        cut = f", cut from {gib(wanted * MIB)} to half the host memory left" if mib < wanted else ""
        note = (
            f"host prompt cache up to {gib(mib * MIB)}{cut}: the KV of long prompts, reused prefixes and named "
            "sessions that other requests overwrite, restored instead of prefilled again"
        )
    return replace(placed, plan=plan, estimate=estimate, notes=(*placed.notes, note))
