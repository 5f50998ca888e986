"""What the scheduler reports about its engine (`Scheduler.stats`, the worker's `/health`)."""

from __future__ import annotations

from dataclasses import dataclass

from backends.llamacpp.worker.prompt_cache import PromptCacheStats


@dataclass(frozen=True)
class SchedulerStats:
    """Counters are per sequence (a group of n counts n requests and n prompts) except
    `prefill_tokens_total`: prompt tokens actually decoded. `cached_prompt_tokens_total` counts the prompt
    tokens each sequence did not prefill itself (see `Usage.cached_tokens`)."""

    slots: int
    slots_busy: int
    queue_depth: int
    kv_cells_used: int
    kv_cells_cached: int
    requests_total: int
    aborted_total: int
    prompt_tokens_total: int
    cached_prompt_tokens_total: int
    prefill_tokens_total: int
    generation_tokens_total: int
    tokens_per_second: float
    prompt_cache: PromptCacheStats  # KV states saved to host memory (`prompt_cache`)
