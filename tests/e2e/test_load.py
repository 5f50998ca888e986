"""Bounded load on the real SmolLM2 worker: 64 concurrent streaming clients, then a disconnect storm.

Every request must end explicitly (a stream ending in [DONE], or a 429/503 with Retry-After), and afterwards
nothing may be left behind: no admitted or queued request in the gateway, no busy slot in the worker.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx
import pytest

from tests.e2e.conftest import Gateway
from tests.e2e.streams import SSE, chat_body, counting_body, stream, wait_until_idle, worker_health

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CLIENTS = 64
REQUESTS = 128
MAX_TOKENS = 8
STORM = 16
TOPICS = ["colour", "fruit", "ocean", "planet", "animal", "city", "river", "tree"]


def outcome(sse: SSE) -> str:
    """'ok', or the explicit refusal the client got ('429'/'503', as a status or as an SSE error frame)."""
    if sse.status == 200:
        if sse.errors:
            error = sse.errors[0]
            assert error["code"] in ("queue_full", "worker_unavailable"), error
            assert sse.done, "an error frame must be followed by [DONE]"
            return {"queue_full": "429", "worker_unavailable": "503"}[error["code"]]
        assert sse.done, sse.body[-300:]
        assert sse.chunks and sse.text(), sse.body[:300]
        return "ok"
    assert sse.status in (429, 503), (sse.status, sse.body[:300])
    assert 1 <= int(sse.headers["retry-after"]) <= 60
    return str(sse.status)


async def test_64_concurrent_streaming_clients_all_end_explicitly_and_leave_the_worker_idle(
    gateway: Gateway,
) -> None:
    before = worker_health(gateway)
    url = gateway.base_url + "/chat/completions"
    gate = asyncio.Semaphore(CLIENTS)
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)

    async def one(client: httpx.AsyncClient, i: int) -> str:
        async with gate:
            prompt = f"Name a {TOPICS[i % len(TOPICS)]} (request {i})."
            return outcome(await stream(client, url, chat_body(prompt, max_tokens=MAX_TOKENS)))

    started = time.monotonic()
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        results = await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))
    elapsed = time.monotonic() - started
    counts = Counter(results)
    assert sum(counts.values()) == REQUESTS
    assert set(counts) <= {"ok", "429", "503"}, counts
    assert counts["ok"] >= REQUESTS // 2, counts  # the queue (64 places) absorbs most of the burst
    admission, health = wait_until_idle(gateway)
    assert admission["running"] == 0 and admission["waiting"] == 0
    assert health["slots_busy"] == 0 and health.get("queue_depth", 0) == 0
    assert health["requests_total"] - before["requests_total"] == counts["ok"]
    print(f"load: {dict(counts)} in {elapsed:.1f} s")


async def test_disconnect_storm_leaves_nothing_behind_and_the_next_request_is_served(gateway: Gateway) -> None:
    rng = random.Random(20261129)
    url = gateway.base_url
    before = worker_health(gateway)

    async def leaver(client: httpx.AsyncClient, i: int) -> None:
        """Drop before the response starts, while queued, or after a random number of chunks."""
        body = counting_body(400) if i % 2 else chat_body("Tell me a long story about a dragon.", max_tokens=400)
        path = "/completions" if i % 2 else "/chat/completions"
        after_lines = rng.choice([0, 1, 2, 5, 10, 20])
        delay_s = rng.uniform(0.0, 0.3)

        async def consume() -> None:
            async with client.stream("POST", url + path, json=body) as response:
                seen = 0
                async for line in response.aiter_lines():
                    if line.startswith(("data:", ":")):
                        seen += 1
                    if seen > after_lines:
                        return  # leave mid-stream: closes the connection

        if after_lines == 0:
            task = asyncio.ensure_future(consume())
            await asyncio.sleep(delay_s)
            task.cancel()  # leave before (or right as) the response starts
            await asyncio.gather(task, return_exceptions=True)
        else:
            await consume()

    # One client per connection so that leaving really closes the socket the gateway sees.
    clients = [httpx.AsyncClient(timeout=60) for _ in range(STORM)]
    try:
        await asyncio.gather(*(leaver(c, i) for i, c in enumerate(clients)))
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))

    wait_until_idle(gateway, timeout_s=30)
    health = worker_health(gateway)
    assert health["aborted_total"] > before["aborted_total"]  # the worker saw the clients leave
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=60) as client:
        after = await stream(client, url + "/chat/completions", chat_body("Say hi.", max_tokens=4))
    assert after.status == 200 and after.done and after.text() and not after.errors
    assert time.monotonic() - started < 15
