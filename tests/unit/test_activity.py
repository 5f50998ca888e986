"""The status page's recent activity: the bounded ring of refused and failed requests (fed by accounting),
and the speed history binned into tokens/s and TTFT."""

from __future__ import annotations

import time

from backends.base import RequestKind
from gateway.errors import ErrorCode, GatewayError
from gateway.ops.activity import Activity
from gateway.ops.auth import Principal
from gateway.ops.metrics import Metrics
from gateway.serving.session import CLIENT_GONE, RequestContext, account


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_errors_are_bounded_and_newest_first() -> None:
    activity = Activity(errors_kept=3)
    for i in range(5):
        activity.error(request_id=f"r{i}", model="m", endpoint="chat", status=429, code="rate_limited")
    assert [e.request_id for e in activity.errors()] == ["r4", "r3", "r2"]


def test_series_bins_tokens_per_second_and_ttft() -> None:
    clock = Clock()
    activity = Activity(history_s=60, clock=clock)
    activity.completed("a", 100, 0.2, 50.0)
    activity.completed("b", 50, 0.4, 40.0)
    clock.now += 25  # two bins later
    activity.completed("a", 30, None, None)
    bins = activity.series(bin_s=10)
    assert len(bins) == 6 and [b.age_s for b in bins] == [50, 40, 30, 20, 10, 0]
    assert bins[-1].tok_s == 3.0 and bins[-1].requests == 1 and bins[-1].ttft_p50_s is None
    assert bins[-3].tok_s == 15.0 and bins[-3].requests == 2 and bins[-3].ttft_p50_s == 0.3
    assert [b.tok_s for b in activity.series("b", bin_s=10)][-3] == 5.0
    clock.now += 60  # everything has aged out
    assert all(b.requests == 0 and b.tok_s == 0 for b in activity.series(bin_s=10))


def test_accounting_records_refusals_with_their_code_and_key() -> None:
    metrics = Metrics(gpu=False)
    ctx = RequestContext("req_1", Principal(key_id="team"), time.monotonic(), kind=RequestKind.CHAT)
    account(metrics, ctx, "m", 200, (3, 4))
    account(metrics, ctx, "m", 404, None, GatewayError(ErrorCode.MODEL_NOT_FOUND, "no such model <b>"))
    account(metrics, ctx, "m", CLIENT_GONE, None)
    gone, missing = metrics.activity.errors()
    assert (missing.status, missing.code, missing.message, missing.key_id) == (
        404,
        "model_not_found",
        "no such model <b>",
        "team",
    )
    assert (gone.status, gone.code, gone.message) == (CLIENT_GONE, "client_closed", None)
