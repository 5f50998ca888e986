"""A worker that freezes (SIGSTOP: a paused host, a hang in native code) ends its requests, then serves again.

Issue 35 item 7: before, a stopped worker kept a unary request open until `upstream_timeout_s` (600 s) and a
stream alive on keep-alives for as long. Now the gateway's health check finds it silent for
`server.worker_frozen_s` (3 s here), kills it (which ends both requests with an error naming the model and the
freeze), and its supervisor restarts it. With the health check off, each call's silence bound
(`gateway.serving.silence`) ends it instead, and the worker is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config
from tests.e2e.streams import (
    SSE,
    chat_body,
    counting_body,
    metric,
    open_stream,
    parse_sse,
    ready_model,
    scrape,
    worker_for,
)

pytestmark = pytest.mark.e2e

FROZEN_S = 3


@pytest.fixture(scope="module")
def frozen_gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("frozen")
    config = write_config(tmp, smollm2_path, free_port(), worker_frozen_s=FROZEN_S)
    with running_gateway(config, tmp / "gateway.log") as gateway:
        yield gateway


async def _first_chunk_then_rest(lines: object, first: asyncio.Event) -> list[str]:
    seen: list[str] = []
    async for line in lines:  # type: ignore[attr-defined]
        seen.append(line)
        if line.startswith("data: {"):
            first.set()
    return seen


async def test_a_stopped_worker_ends_its_stream_and_unary_request_then_is_restarted(frozen_gateway: Gateway) -> None:
    gateway = frozen_gateway
    victim = worker_for(gateway, MODEL)
    async with httpx.AsyncClient(timeout=120) as client:
        unary = asyncio.create_task(
            client.post(gateway.base_url + "/completions", json={**counting_body(600), "stream": False})
        )
        async with open_stream(gateway.base_url + "/completions", counting_body(600)) as response:
            assert response.status_code == 200
            first = asyncio.Event()
            rest = asyncio.create_task(_first_chunk_then_rest(response.aiter_lines(), first))
            await asyncio.wait_for(first.wait(), 60)
            victim.suspend()  # SIGSTOP: the process is there, holds its sockets, answers nothing
            seen = await asyncio.wait_for(rest, 60)  # a hang guard, not a speed limit
        answer = await asyncio.wait_for(unary, 60)

    sse = SSE(200, response.headers)
    parse_sse("\n".join(seen).encode(), sse)
    assert sse.data[-1] == "[DONE]" and len(sse.errors) == 1, seen[-5:]
    for message in (sse.errors[0]["message"], answer.json()["error"]["message"]):
        assert MODEL in message and "no health check" in message, message
    assert answer.status_code == 503, answer.text
    assert answer.headers.get("retry-after")

    with contextlib.suppress(psutil.NoSuchProcess):  # killed: gone, or a zombie until its parent reaps it
        assert victim.status() == psutil.STATUS_ZOMBIE
    # The supervisor restarted it: served again, one restart, the freeze counted by its cause.
    async with httpx.AsyncClient(timeout=120) as client:
        for _ in range(2):  # a request that meets the restart's first moment may get the 503 for it
            reply = await client.post(gateway.base_url + "/chat/completions", json=chat_body(stream=False))
            if reply.status_code == 200:
                break
            await asyncio.sleep(1)
        assert reply.status_code == 200, reply.text
    assert worker_for(gateway, MODEL).pid != victim.pid
    assert ready_model(gateway, MODEL)["restarts"] == 1
    assert metric(scrape(gateway), "voltgate:worker_crashes_total", model=MODEL, cause="frozen") == 1
    assert "answered no health check" in gateway.log()


SILENCE_FLOOR_S = 5


@pytest.fixture(scope="module")
def unwatched_gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """No health watchdog (`worker_frozen_s: null`): a stuck worker is found only by its silence on a call, after
    max(5 s, 4 x its predicted silence): a stream's step, a non-streamed answer's whole generation. One session,
    so no call waits behind another's prefill (the queue term is 0 and a short answer's bound is the floor);
    `upstream_timeout_s` an hour, so a call that ends with upstream_timeout within a test's hang guard ended at
    its silence bound."""
    tmp = tmp_path_factory.mktemp("silent")
    model = model_entry(smollm2_path, concurrency=1)
    config = write_config(tmp, smollm2_path, free_port(), models=[model], worker_frozen_s=None,
                          stream_silence_floor_s=SILENCE_FLOOR_S, upstream_timeout_s=3600)  # fmt: skip
    with running_gateway(config, tmp / "gateway.log") as gateway:
        yield gateway


async def test_a_stream_whose_worker_goes_silent_ends_at_its_silence_bound(unwatched_gateway: Gateway) -> None:
    """The worker stopped mid-stream with nothing else watching it: the stream ends with the upstream_timeout
    error frame naming the model (not after `upstream_timeout_s`), and the worker, resumed, serves on
    (it was never killed)."""
    gateway = unwatched_gateway
    victim = worker_for(gateway, MODEL)
    try:
        async with open_stream(gateway.base_url + "/completions", counting_body(600)) as response:
            assert response.status_code == 200
            first = asyncio.Event()
            rest = asyncio.create_task(_first_chunk_then_rest(response.aiter_lines(), first))
            await asyncio.wait_for(first.wait(), 60)
            victim.suspend()
            seen = await asyncio.wait_for(rest, 120)  # a hang guard, not a speed limit
    finally:
        victim.resume()
    sse = SSE(200, response.headers)
    parse_sse("\n".join(seen).encode(), sse)
    assert sse.data[-1] == "[DONE]" and len(sse.errors) == 1, seen[-5:]
    assert sse.errors[0]["code"] == "upstream_timeout" and MODEL in sse.errors[0]["message"], sse.errors
    async with httpx.AsyncClient(timeout=120) as client:
        reply = await client.post(gateway.base_url + "/chat/completions", json=chat_body(stream=False))
    assert reply.status_code == 200, reply.text
    assert worker_for(gateway, MODEL).pid == victim.pid


async def test_a_unary_request_to_a_silent_worker_ends_at_its_silence_bound(unwatched_gateway: Gateway) -> None:
    """A non-streamed request to a stopped worker with nothing else watching it gets the 504 upstream_timeout
    naming the model, counted as such, at its silence bound (not after `upstream_timeout_s`, an hour here); the
    worker, resumed, answers a healthy non-streamed request of 64 tokens under the same rule (its bound: 4 x its
    predicted generation) and was never killed."""
    gateway = unwatched_gateway
    victim = worker_for(gateway, MODEL)
    async with httpx.AsyncClient(timeout=600) as client:
        victim.suspend()  # SIGSTOP: its socket still accepts, nothing answers
        try:
            silent = client.post(gateway.base_url + "/chat/completions", json=chat_body(stream=False))
            answer = await asyncio.wait_for(silent, 240)  # a hang guard, not a speed limit
        finally:
            victim.resume()
        healthy = await client.post(gateway.base_url + "/completions", json={**counting_body(64), "stream": False})
    assert answer.status_code == 504, answer.text
    error = answer.json()["error"]
    assert error["code"] == "upstream_timeout" and MODEL in error["message"], error
    assert answer.headers.get("retry-after")
    assert metric(scrape(gateway), "voltgate:requests_total", model=MODEL, endpoint="chat", status="504") == 1
    assert healthy.status_code == 200, healthy.text
    assert healthy.json()["usage"]["completion_tokens"] == 64
    assert worker_for(gateway, MODEL).pid == victim.pid
