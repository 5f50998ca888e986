"""Admission through the real gateway: 503 while the worker loads, a one-slot model with a one-place queue
(429 with Retry-After beyond it), and SSE keep-alive comments while a stream waits for its slot."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, start_gateway, stop_gateway, write_config
from tests.e2e.streams import (
    chat_body,
    counting_body,
    metric,
    open_stream,
    ready_model,
    scrape,
    stream,
    wait_until_idle,
)

pytestmark = pytest.mark.e2e

KEEPALIVE_S = 0.2


@dataclass
class Admitting:
    gateway: Gateway
    while_loading: httpx.Response  # a request sent before the worker was ready
    ready_while_loading: httpx.Response  # /ready just before it


@pytest.fixture(scope="module")
def admitting(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Admitting]:
    tmp = tmp_path_factory.mktemp("admission")
    model = model_entry(smollm2_path, concurrency=1, max_queue=1, llamacpp={"n_threads": 2})
    config = write_config(
        tmp, smollm2_path, free_port(), models=[model], keepalive_interval_s=KEEPALIVE_S, log_prompts=True
    )
    gateway = start_gateway(config, tmp / "gateway.log")
    try:
        # Ask as soon as the HTTP server is up: the worker is still loading the model.
        deadline = time.monotonic() + 60
        while True:
            assert gateway.process.poll() is None, gateway.log()
            try:
                httpx.get(gateway.url + "/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, gateway.log()
                time.sleep(0.02)
        body = chat_body(stream=False, max_tokens=2)
        early_ready = httpx.get(gateway.url + "/ready", timeout=5)
        early = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=120)
        gateway.wait_ready()
        yield Admitting(gateway, early, early_ready)
    finally:
        stop_gateway(gateway)


def test_a_request_while_the_worker_loads_waits_for_it_and_is_served(admitting: Admitting) -> None:
    """Right after `serving on ...` the pinned model is still loading (/ready says so): the first request
    waits for the load and is answered, instead of the 503 it used to get (issue 21)."""
    ready = admitting.ready_while_loading
    if ready.status_code == 200:
        pytest.skip("the worker was ready before the first request could be sent (nothing to wait for)")
    assert ready.status_code == 503 and ready.json()["not_ready"] == [MODEL]
    response = admitting.while_loading
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["role"] == "assistant"


async def test_beyond_slots_and_queue_is_429_and_the_queued_stream_gets_keepalives(admitting: Admitting) -> None:
    url = admitting.gateway.base_url
    before = scrape(admitting.gateway)
    async with httpx.AsyncClient(timeout=60) as client:
        # 1) Take the only slot with a long stream and wait until it is generating.
        async with client.stream("POST", url + "/completions", json=counting_body(300)) as running:
            assert running.status_code == 200
            lines = running.aiter_lines()
            while not (await lines.__anext__()).startswith("data: {"):
                pass
            # 2) The next stream waits in the one-place queue ...
            queued = asyncio.create_task(stream(client, url + "/chat/completions", chat_body(max_tokens=4)))
            while ready_model(admitting.gateway)["waiting"] < 1:
                await asyncio.sleep(0.02)
            # 3) ... so anything more is refused at once, streaming or not, with Retry-After <= 60 s.
            for body in (chat_body(max_tokens=2), chat_body(max_tokens=2, stream=False)):
                refused = await client.post(url + "/chat/completions", json=body)
                assert refused.status_code == 429, refused.text
                error = refused.json()["error"]
                assert (error["type"], error["code"]) == ("rate_limit_error", "queue_full")
                assert 1 <= int(refused.headers["retry-after"]) <= 60
                assert "x-should-retry" not in refused.headers  # worth retrying later
            await asyncio.sleep(3 * KEEPALIVE_S)
            assert not queued.done()
        # 4) Closing the long stream frees the slot; the queued stream is served and ends normally.
        waited = await asyncio.wait_for(queued, 60)
    assert waited.status == 200
    assert waited.headers["content-type"].startswith("text/event-stream")
    assert len(waited.comments) >= 2, waited.body[:300]
    first_data = waited.body.index(b"data:")
    assert waited.body[:first_data].startswith(b": "), waited.body[:200]
    assert waited.done and waited.text()
    assert not waited.errors
    wait_until_idle(admitting.gateway)
    # Both refusals are counted as 429s (not as client disconnects), by model and reason.
    after = scrape(admitting.gateway)
    for name, labels in (
        ("voltgate:requests_total", {"endpoint": "chat", "status": "429"}),
        ("voltgate:rejected_requests_total", {"code": "queue_full"}),
    ):
        grew = (metric(after, name, model=MODEL, **labels) or 0) - (metric(before, name, model=MODEL, **labels) or 0)
        assert grew == 2, (name, labels)


async def test_queued_client_that_leaves_frees_its_place(admitting: Admitting) -> None:
    url = admitting.gateway.base_url
    async with open_stream(url + "/completions", counting_body(300)) as running:
        lines = running.aiter_lines()
        while not (await lines.__anext__()).startswith("data: {"):
            pass
        async with open_stream(url + "/chat/completions", chat_body()) as queued:
            assert queued.status_code == 200
            first = await queued.aiter_lines().__anext__()
            assert first.startswith(":")
            assert ready_model(admitting.gateway)["waiting"] == 1
        # The queued client left: its place is free again.
        deadline = time.monotonic() + 5
        while ready_model(admitting.gateway)["waiting"] != 0:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
    wait_until_idle(admitting.gateway)
    served = await asyncio.to_thread(
        httpx.post, url + "/chat/completions", json=chat_body(stream=False, max_tokens=2), timeout=60
    )
    assert served.status_code == 200


def test_prompts_reach_the_access_log_only_when_explicitly_enabled(admitting: Admitting) -> None:
    """This gateway sets `server.log_prompts: true`; the keyed one (test_keys.py) shows the default."""
    marker = "log-prompts-marker-5d1f"
    body = chat_body(f"{marker} Say hi.", max_tokens=2, stream=False)
    response = httpx.post(
        admitting.gateway.base_url + "/chat/completions", json=body, headers={"x-request-id": "req-prompt"}, timeout=60
    )
    assert response.status_code == 200
    deadline = time.monotonic() + 10
    while True:
        entries = [
            json.loads(line.split("voltgate.access: ", 1)[1])
            for line in admitting.gateway.log().splitlines()
            if "voltgate.access: {" in line
        ]
        entry = next((e for e in entries if e["request_id"] == "req-prompt"), None)
        if entry is not None:
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert entry["prompt"] == [{"role": "user", "content": f"{marker} Say hi."}]
