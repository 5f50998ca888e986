"""How a model lives, as values: its `Policy` (pinned or on demand) and the one `Backoff` every failure uses.

The states and transitions these values steer are drawn once, in docs/lifecycle.md.
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
admin load or a config reload asks for it."""


@dataclass(frozen=True)
class Policy:
    """What differs between a pinned model and an on-demand one. Nothing else in the lifecycle asks which
    kind a model is.

    `at_boot`: loaded when the gateway starts (or a reload adds it). `evictable`: may be unloaded to make room
    or when idle. `restarts`: after a failure the lifecycle starts it again by itself once the backoff ends
    (requests that come meanwhile wait for that start); without it the failure is remembered for the backoff
    (requests get it at once) and the next request after it loads the model again."""

    load: Literal["always", "on_demand"]
    at_boot: bool
    evictable: bool
    restarts: bool
    idle_unload_s: float | None = None

    @property
    def pinned(self) -> bool:
        return self.load == "always"


PINNED = Policy("always", at_boot=True, evictable=False, restarts=True)


def policy_for(load: Literal["always", "on_demand"], idle_unload_s: float | None = None) -> Policy:
    """The policy of a model by its config `load`."""
    if load == "always":
        return PINNED
    return Policy("on_demand", at_boot=False, evictable=True, restarts=False, idle_unload_s=idle_unload_s)


class Backoff:
    """Failures in a row and the wait before the next start: `BACKOFF_INITIAL_S` doubling to `BACKOFF_MAX_S`.

    `fail()` counts a failure and returns the wait (also kept as `retry_at`); `served_for(s)` starts over when
    the model had been READY `HEALTHY_RESET_S` before it failed; `reset()` after a load that succeeded, an
    unload or an explicit retry."""

    def __init__(self, healthy_reset_s: float = HEALTHY_RESET_S) -> None:
        self.failures = 0
        self.retry_at: float | None = None
        self.healthy_reset_s = healthy_reset_s

    def fail(self) -> float:
        self.failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2.0 ** (self.failures - 1))
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
