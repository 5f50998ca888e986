"""Recent activity for the status page (`gateway.ops.status`): the last refused or failed requests, and a short
history of generation speed. Both are bounded rings in memory, fed by request accounting
(`gateway.serving.session.account` and `RequestScope.finish`); nothing here is persisted.

- `errors`: the last ERRORS_KEPT requests answered with a status of 400 or more (499: the client went away),
  with the error code and message the client saw, the model, endpoint and the key id (never the key).
- speed: each completed generating request's completion tokens, TTFT and decode speed, kept for
  HISTORY_S seconds, and binned on demand (`series`) into BIN_S buckets: tokens/s generated in the bucket
  (all models together, or one model's) and the p50 TTFT of the requests that finished in it.

Concurrency: called only from the gateway's event loop, and no method awaits, so no lock is needed.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.ops.live_speed import percentile

ERRORS_KEPT = 50
HISTORY_S = 600.0
BIN_S = 10.0
POINTS_KEPT = 5000  # completed requests kept for the history (bounded memory whatever the rate)


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """One refused or failed request, as its client saw it."""

    at: float  # wall clock (time.time())
    request_id: str
    model: str
    endpoint: str
    status: int
    code: str | None
    message: str | None
    key_id: str | None


@dataclass(frozen=True, slots=True)
class SpeedPoint:
    """One completed generating request."""

    at: float  # monotonic
    model: str
    completion_tokens: int
    ttft_s: float | None
    decode_tok_s: float | None


@dataclass(frozen=True, slots=True)
class SpeedBin:
    """BIN_S seconds of history: `age_s` is how long ago the bin ended (0: the bin now filling)."""

    age_s: float
    requests: int
    tok_s: float
    ttft_p50_s: float | None


class Activity:
    def __init__(
        self,
        *,
        errors_kept: int = ERRORS_KEPT,
        history_s: float = HISTORY_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.history_s = history_s
        self._errors: deque[ErrorEvent] = deque(maxlen=errors_kept)
        self._points: deque[SpeedPoint] = deque(maxlen=POINTS_KEPT)
        self._clock = clock
        self._wall = wall

    def error(self, *, request_id: str, model: str, endpoint: str, status: int, code: str | None = None,
              message: str | None = None, key_id: str | None = None) -> None:  # fmt: skip
        self._errors.append(ErrorEvent(self._wall(), request_id, model, endpoint, status, code, message, key_id))

    def errors(self) -> list[ErrorEvent]:
        """Newest first."""
        return list(reversed(self._errors))

    def completed(self, model: str, completion_tokens: int, ttft_s: float | None, decode_tok_s: float | None) -> None:
        self._points.append(SpeedPoint(self._clock(), model, completion_tokens, ttft_s, decode_tok_s))
        self._trim()

    def _trim(self) -> None:
        horizon = self._clock() - self.history_s
        while self._points and self._points[0].at < horizon:
            self._points.popleft()

    def series(self, model: str | None = None, bin_s: float = BIN_S) -> list[SpeedBin]:
        """The last `history_s` in bins of `bin_s`, oldest first; every bin is there, empty ones with 0 tok/s."""
        self._trim()
        now = self._clock()
        count = max(1, int(self.history_s // bin_s))
        tokens = [0] * count
        requests = [0] * count
        ttfts: list[list[float]] = [[] for _ in range(count)]
        for point in self._points:
            if model is not None and point.model != model:
                continue
            index = count - 1 - int((now - point.at) // bin_s)
            if 0 <= index < count:
                tokens[index] += point.completion_tokens
                requests[index] += 1
                if point.ttft_s is not None:
                    ttfts[index].append(point.ttft_s)
        return [
            SpeedBin(
                age_s=(count - 1 - i) * bin_s,
                requests=requests[i],
                tok_s=round(tokens[i] / bin_s, 2),
                ttft_p50_s=_round(percentile(ttfts[i], 50)),
            )
            for i in range(count)
        ]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
