"""Many clients at once, clients that walk away, and a worker that dies: nothing hangs, nothing is lost."""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import psutil
import pytest

from tests.e2e.conftest import MODEL, Gateway

pytestmark = pytest.mark.e2e

PROMPTS = [
    "Name a colour.",
    "Count from one to five.",
    "What is the capital of Italy?",
    "Say something about cats.",
    "Name a fruit.",
    "What is two plus two?",
    "Name an ocean.",
    "Say good morning in French.",
]


def stream_text(gateway: Gateway, prompt: str, max_tokens: int = 24) -> str:
    stream = gateway.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0, stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def worker_process(gateway: Gateway) -> psutil.Process:
    children = psutil.Process(gateway.process.pid).children(recursive=True)
    workers = [p for p in children if "backends.llamacpp.worker" in " ".join(p.cmdline())]
    assert len(workers) == 1, [p.cmdline() for p in children]
    return workers[0]


def test_eight_concurrent_streams_complete_with_their_own_outputs(gateway: Gateway) -> None:
    solo = {p: stream_text(gateway, p) for p in PROMPTS}
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = dict(zip(PROMPTS, pool.map(lambda p: stream_text(gateway, p), PROMPTS), strict=True))
    for prompt in PROMPTS:
        assert together[prompt].strip(), prompt
        assert together[prompt] == solo[prompt], prompt


def worker_health(gateway: Gateway) -> dict[str, Any]:
    """The worker's own /health (its scheduler's counters), read past the gateway."""
    argv = worker_process(gateway).cmdline()
    port = int(argv[argv.index("--port") + 1])
    response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_client_disconnect_mid_stream_frees_the_worker(gateway: Gateway) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 900,
        "ignore_eos": True,  # the story cannot end by itself just as the client leaves: only an abort ends it early
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    before = worker_health(gateway)
    with httpx.stream("POST", gateway.base_url + "/chat/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        received = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in received)
        assert worker_health(gateway)["slots_busy"] == 1  # still generating when the client leaves
    # The worker must notice and abort this request (its own counter, not a log line another test may have
    # left) ...
    deadline = time.monotonic() + 30
    while worker_health(gateway)["aborted_total"] == before["aborted_total"] and time.monotonic() < deadline:
        time.sleep(0.1)
    after = worker_health(gateway)
    # On failure, what the gateway and its worker logged (the access line's status, the worker's end reason):
    # this failed once in CI (2026-12-06, before `ignore_eos`) and not in 20 runs here.
    assert after["aborted_total"] == before["aborted_total"] + 1, (after, gateway.log()[-4000:])
    # ... long before the 900 tokens it was asked for, and its slot must be free: nothing runs or waits.
    assert after["generation_tokens_total"] - before["generation_tokens_total"] < 900
    assert (after["slots_busy"], after["queue_depth"]) == (0, 0), after
    assert httpx.get(gateway.url + "/ready", timeout=5).json()["models"][MODEL]["running"] == 0
    quick = gateway.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert quick.usage is not None and 1 <= quick.usage.completion_tokens <= 3


def test_killed_worker_is_restarted_and_a_request_meanwhile_waits_for_it(gateway: Gateway) -> None:
    victim = worker_process(gateway)
    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    # While it restarts, a request waits for the new worker and is served (never a hang, a 500 or a 503:
    # a pinned model that restarts is waited for as at boot). Only a request that reached the dead worker
    # before its death was noticed may get a 503 for the lost connection.
    for _ in range(2):
        try:
            reply = gateway.client().chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
            break
        except openai.InternalServerError as exc:
            assert exc.status_code == 503 and "connection" in str(exc), exc
    else:
        raise AssertionError("no answer after the restart:\n" + gateway.log()[-3000:])
    assert reply.usage is not None and 1 <= reply.usage.completion_tokens <= 2
    assert worker_process(gateway).pid != victim.pid
    ready = httpx.get(gateway.url + "/ready", timeout=5).json()["models"][MODEL]
    assert ready["restarts"] == 1
