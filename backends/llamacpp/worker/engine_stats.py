"""What the scheduler reports about its engine (`Scheduler.stats`, the worker's `/health`)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from backends.llamacpp.worker.checkpoints import CheckpointStats
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
    checkpoints: CheckpointStats  # a recurrent or hybrid model's context checkpoints (`checkpoints`)


THROUGHPUT_WINDOW_S = 10.0


class EngineCounters:
    """The scheduler's running totals behind `SchedulerStats`. Not thread-safe: the scheduler calls it under
    its own lock."""

    def __init__(self) -> None:
        self._counts = {"requests": 0, "aborted": 0, "prompt": 0, "cached": 0, "prefilled": 0, "generated": 0}
        self._recent: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)
        self._kv = (0, 0)  # cells used by running sequences, cells cached in free slots
        self._started_s = time.monotonic()

    def step(self, now_s: float, generated: int, prefilled: int) -> None:
        self._counts["generated"] += generated
        self._counts["prefilled"] += prefilled
        self._recent.append((now_s, generated))
        self._trim(now_s)

    def ended(self, *, aborted: bool, prompt: int, cached: int) -> None:
        """A sequence ended (`prompt` 0 for one cancelled while queued)."""
        c = self._counts
        c["requests"] += 1
        c["aborted"] += int(aborted)
        c["prompt"] += prompt
        c["cached"] += cached

    def kv(self, used: int, cached: int) -> None:
        self._kv = (used, cached)

    def snapshot(
        self,
        now_s: float,
        *,
        slots: int,
        busy: int,
        queued: int,
        prompt_cache: PromptCacheStats,
        checkpoints: CheckpointStats,
    ) -> SchedulerStats:
        self._trim(now_s)
        window_s = min(THROUGHPUT_WINDOW_S, max(now_s - self._started_s, 1e-3))
        c = self._counts
        return SchedulerStats(
            slots=slots,
            slots_busy=busy,
            queue_depth=queued,
            kv_cells_used=self._kv[0],
            kv_cells_cached=self._kv[1],
            requests_total=c["requests"],
            aborted_total=c["aborted"],
            prompt_tokens_total=c["prompt"],
            cached_prompt_tokens_total=c["cached"],
            prefill_tokens_total=c["prefilled"],
            generation_tokens_total=c["generated"],
            tokens_per_second=round(sum(n for _, n in self._recent) / window_s, 2),
            prompt_cache=prompt_cache,
            checkpoints=checkpoints,
        )

    def _trim(self, now_s: float) -> None:
        while self._recent and self._recent[0][0] < now_s - THROUGHPUT_WINDOW_S:
            self._recent.popleft()
