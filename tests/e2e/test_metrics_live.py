"""`curl /metrics` after a few real requests shows live series (requests, latencies, tokens, queue, worker), and
`/v1/placement` and `/metrics` set the measured speed beside the plan's prediction.

Runs on the shared session gateway (open mode), so it compares scrapes before and after its own requests.
"""

from __future__ import annotations

import math
import time
from typing import Any

import httpx
import pytest

from gateway.ops.live_speed import WINDOW_REQUESTS
from tests.e2e.conftest import MODEL, Gateway
from tests.e2e.streams import COUNTING, Samples, chat_body, metric, scrape, stream

pytestmark = pytest.mark.e2e


def delta(before: Samples, after: Samples, name: str, /, **labels: str) -> float:
    return (metric(after, name, **labels) or 0.0) - (metric(before, name, **labels) or 0.0)


async def test_metrics_show_live_series_after_a_few_requests(gateway: Gateway) -> None:
    before = scrape(gateway)
    url = gateway.base_url
    async with httpx.AsyncClient(timeout=60) as client:
        plain = await stream(client, url + "/chat/completions", chat_body("Name a colour.", max_tokens=8))
        usage = await stream(
            client,
            url + "/chat/completions",
            chat_body("Count to five.", max_tokens=8, stream_options={"include_usage": True}),
        )
        unary = await client.post(url + "/chat/completions", json=chat_body(max_tokens=4, stream=False))
        completion = await client.post(
            url + "/completions", json={"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4}
        )
        embedding = await client.post(url + "/embeddings", json={"model": MODEL, "input": "hi"})
    assert plain.done and usage.done and unary.status_code == 200 and completion.status_code == 200
    assert embedding.status_code == 400  # llama.cpp deployments do not serve embeddings: refused up front
    expected_tokens = sum(c["usage"]["completion_tokens"] for c in usage.chunks if c.get("usage"))
    expected_tokens += unary.json()["usage"]["completion_tokens"] + completion.json()["usage"]["completion_tokens"]

    # Streams are accounted just after their last byte; give the gateway a moment.
    deadline = time.monotonic() + 5
    while True:
        after = scrape(gateway)
        if delta(before, after, "voltgate:requests_total", model=MODEL, endpoint="chat", status="200") >= 3:
            break
        assert time.monotonic() < deadline, "streams were never counted"
        time.sleep(0.1)

    m = {"model": MODEL}
    assert delta(before, after, "voltgate:requests_total", model=MODEL, endpoint="chat", status="200") == 3
    assert delta(before, after, "voltgate:requests_total", model=MODEL, endpoint="completion", status="200") == 1
    assert delta(before, after, "voltgate:requests_total", model=MODEL, endpoint="embedding", status="400") == 1
    assert delta(before, after, "voltgate:rejected_requests_total", model=MODEL, code="unsupported_parameter") == 1
    # Latency histograms cover requests that reached a worker; refusals are counted, not timed.
    assert delta(before, after, "voltgate:e2e_request_latency_seconds_count", **m) == 4
    assert delta(before, after, "voltgate:e2e_request_latency_seconds_sum", **m) > 0
    assert delta(before, after, "voltgate:time_to_first_token_seconds_count", **m) == 2
    assert delta(before, after, "voltgate:inter_token_latency_seconds_count", **m) >= 2
    assert delta(before, after, "voltgate:request_queue_time_seconds_count", **m) == 4
    assert delta(before, after, "voltgate:prompt_tokens_total", **m) > 0
    # Generation tokens come from the engine's exact usage, also for streams the client asked no usage for.
    assert delta(before, after, "voltgate:generation_tokens_total", **m) >= expected_tokens + 1
    assert metric(after, "voltgate:num_requests_running", **m) == 0
    assert metric(after, "voltgate:num_requests_waiting", **m) == 0
    assert metric(after, "voltgate:worker_state", model=MODEL, engine="llamacpp", state="ready") == 1
    assert metric(after, "voltgate:worker_state", model=MODEL, engine="llamacpp", state="failed") == 0
    assert metric(after, "voltgate:worker_restarts_total", **m) is not None
    # No GPUs on this host: no GPU series, and the scrape still works.
    assert not [name for name, _ in after if "gpu" in name]


def test_worker_slots_and_kv_cells_are_fed_from_the_worker_health(gateway: Gateway) -> None:
    deadline = time.monotonic() + 10  # the gateway polls every worker's /health every 2 s
    while True:
        samples = scrape(gateway)
        slots = metric(samples, "voltgate:worker_slots", model=MODEL)
        busy = metric(samples, "voltgate:worker_slots_busy", model=MODEL)
        cells = metric(samples, "voltgate:worker_kv_cells_used", model=MODEL)
        if None not in (slots, busy, cells) and busy == 0:
            break
        assert time.monotonic() < deadline, {k: v for k, v in samples.items() if "worker" in k[0]}
        time.sleep(0.25)
    assert slots == 4  # the config asks for concurrency 4
    assert cells is not None and cells >= 0
    assert metric(samples, "voltgate:worker_kv_cells", model=MODEL) == 4 * 4096  # 4 slots x 4,096 tokens


def test_open_mode_was_announced_loudly_at_start(gateway: Gateway) -> None:
    warnings = [line for line in gateway.log().splitlines() if "OPEN MODE" in line]
    assert warnings and "WARNING" in warnings[0]


def placement_of(gateway: Gateway) -> dict[str, Any]:
    body = httpx.get(gateway.base_url + "/placement", timeout=5).json()
    decision: dict[str, Any] = next(d for d in body["decisions"] if d["model"] == MODEL)
    return decision


def test_placement_and_metrics_set_the_measured_speed_beside_the_prediction(gateway: Gateway) -> None:
    before = placement_of(gateway)["measured"]["window_requests"]
    client = gateway.client()
    messages = [{"role": "user", "content": COUNTING}]
    for _ in range(2):  # one after another: each decodes alone
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                                     stream=True))  # fmt: skip
        assert chunks[-1].choices[0].finish_reason is not None
    for _ in range(2):
        answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        assert answer.usage is not None and answer.usage.completion_tokens >= 2
    sent = 4
    expected = min(WINDOW_REQUESTS, before + sent)  # the shared gateway has served other tests' requests
    deadline = time.monotonic() + 5  # a stream is accounted just after its last byte
    while (decision := placement_of(gateway))["measured"]["window_requests"] < expected:
        assert time.monotonic() < deadline, decision["measured"]
        time.sleep(0.1)

    measured, prediction = decision["measured"], decision["prediction"]
    assert prediction["decode_tok_s_1"] > 0  # the prediction is still there, as it was
    assert measured["window_requests"] == expected
    assert measured["decode_tok_s_per_stream"]["n"] >= 2 and measured["decode_tok_s_per_stream"]["p50"] > 0
    assert measured["decode_tok_s_single_stream"]["p50"] > 0
    assert measured["ttft_s"]["p50"] > 0 and measured["unary_tok_s"]["p50"] > 0
    assert measured["mean_prompt_tokens"] > 0 and measured["mean_concurrent_streams"] >= 1
    ratios = measured["ratio_to_predicted"]
    assert set(ratios) == {"decode_single", "decode_per_stream", "ttft"}
    assert all(isinstance(r, float) and math.isfinite(r) and r > 0 for r in ratios.values()), ratios

    after = scrape(gateway)
    predicted = "voltgate:predicted_decode_tokens_per_second"
    assert metric(after, predicted, model=MODEL, streams="1") == prediction["decode_tok_s_1"]
    if prediction["sessions"] > 1:
        many = metric(after, predicted, model=MODEL, streams=str(prediction["sessions"]))
        assert many == prediction["decode_tok_s_per_stream"]
    assert metric(after, "voltgate:predicted_ttft_seconds", model=MODEL) == prediction["ttft_s"]
    assert (metric(after, "voltgate:measured_decode_tokens_per_second", model=MODEL) or 0) > 0
    assert (metric(after, "voltgate:measured_ttft_seconds", model=MODEL) or 0) > 0
