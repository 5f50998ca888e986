"""How a model lives, as values: its `Policy` (pinned, on demand, or a remote endpoint) and `Backoff`, one per
worker (`gateway.lifecycle.workers.Worker.backoff`), which every failure of the model uses.

The states and transitions these values steer are drawn once, above `gateway.lifecycle.workers.WorkerState`;
docs/lifecycle.md says what each policy does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

BACKOFF_INITIAL_S = 1.0
"""The wait after a first failure; each failure in a row doubles it."""
BACKOFF_MAX_S = 60.0
HEALTHY_RESET_S = 30.0
"""READY this long before a crash, and the crash is a new incident: the backoff and the streak start over."""
CRASH_LIMIT = 3
"""Failures in a row, with no request served between them, after which a model is not started again until an
admin load or a config reload asks for it (unless its policy never `gives_up`)."""
REMOTE_BACKOFF_MAX_S = 5.0
"""The longest wait between two checks of a remote endpoint that does not answer: with one check's timeout
(`gateway.lifecycle.remote.CHECK_TIMEOUT_S`), the bound on how long a model stays FAILED after its endpoint
answers again (docs/lifecycle.md, "A remote endpoint")."""


@dataclass(frozen=True)
class Policy:
    """What differs between a pinned model, an on-demand one and a remote endpoint. Nothing else in the
    lifecycle asks which kind a model is.

    `at_boot`: loaded when the gateway starts (or a reload adds it). `evictable`: may be unloaded to make room
    or when idle. `restarts`: after a failure the lifecycle starts it again by itself once the backoff ends
    (requests that come meanwhile wait for that start); without it the failure is remembered for the backoff
    (requests get it at once) and the next request after it loads the model again. `gives_up`: after
    `CRASH_LIMIT` failures in a row with no request served between, stop restarting until an explicit retry;
    without it, restart forever. `backoff_max_s`: the cap of the `Backoff` between failures."""

    load: Literal["always", "on_demand"]
    at_boot: bool
    evictable: bool
    restarts: bool
    idle_unload_s: float | None = None
    gives_up: bool = True
    backoff_max_s: float = BACKOFF_MAX_S

    @property
    def pinned(self) -> bool:
        return self.load == "always"


PINNED = Policy("always", at_boot=True, evictable=False, restarts=True)
REMOTE = Policy(
    "always", at_boot=True, evictable=False, restarts=True, gives_up=False, backoff_max_s=REMOTE_BACKOFF_MAX_S
)
"""An endpoint on another host: pinned, checked again every few seconds while it does not answer, never given up
on (it may be down for an hour and must come back by itself)."""


def policy_for(
    load: Literal["always", "on_demand"], idle_unload_s: float | None = None, *, remote: bool = False
) -> Policy:
    """The policy of a model by its config `load` and whether its source is a remote endpoint (which the config
    allows only with `load: always`)."""
    if remote:
        return REMOTE
    if load == "always":
        return PINNED
    return Policy("on_demand", at_boot=False, evictable=True, restarts=False, idle_unload_s=idle_unload_s)


class Backoff:
    """Failures in a row and the wait before the next start: `BACKOFF_INITIAL_S` doubling to `max_s` (its policy's
    `backoff_max_s`, `BACKOFF_MAX_S` by default).

    `fail()` counts a failure and returns the wait (also kept as `retry_at`); `served_for(s)` starts over when
    the model had been READY `HEALTHY_RESET_S` before it failed; `reset()` after a load that succeeded, an
    unload or an explicit retry."""

    def __init__(self, healthy_reset_s: float = HEALTHY_RESET_S, max_s: float = BACKOFF_MAX_S) -> None:
        self.failures = 0
        self.retry_at: float | None = None
        self.healthy_reset_s = healthy_reset_s
        self.max_s = max_s

    def fail(self) -> float:
        self.failures += 1
        delay = min(self.max_s, BACKOFF_INITIAL_S * 2.0 ** min(self.failures - 1, 30))
        self.retry_at = time.monotonic() + delay
        return delay

    def served_for(self, ready_s: float | None) -> None:
        if ready_s is not None and ready_s >= self.healthy_reset_s:
            self.reset()

    def reset(self) -> None:
        self.failures, self.retry_at = 0, None

    def waiting(self) -> bool:
        """True while a remembered failure's wait has not ended."""
        return self.retry_at is not None and time.monotonic() < self.retry_at

    def left_s(self) -> float:
        return max(0.0, (self.retry_at or 0.0) - time.monotonic())
