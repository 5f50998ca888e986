"""Hot prefixes kept in host memory on the real worker with one slot (issue 22): a prompt that overwrites
the slot saves its KV state (`--prompt-cache-mib`), and the next prompt sharing that prefix gets it back,
with the same greedy answer as its cold prefill; the bound evicts the oldest state; 0 turns it off."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LONG_PROMPT_THREADS
from tests.integration.test_llamacpp_worker import Worker
from tests.worker_process import MODEL, running_worker

pytestmark = pytest.mark.integration

# SmolLM2-135M keeps ~22.5 KiB of bf16 KV per token: a ~650-token prompt's state is ~14 MiB, so a
# 20 MiB cache holds one of them and not two.
SMALL_CACHE_MIB = "20"


def document(topic: str) -> str:
    facts = " ".join(
        f"Fact {i} about {topic}: the {topic} item number {i} weighs {i * 7 % 31} grams." for i in range(36)
    )
    return f"Read these notes on {topic} carefully. {facts}"


A, B, C = document("apples"), document("bicycles"), document("comets")


@contextlib.contextmanager
def running(smollm2_path: Path, tmp_path: Path, *extra: str) -> Iterator[Worker]:
    log_path = tmp_path / "worker.log"
    threads = str(LONG_PROMPT_THREADS)
    args = ("--ctx", "2048", "--slots", "1", "--n-threads", threads, *extra)
    with running_worker(smollm2_path, log_path, *args, ready_s=120) as (process, url):
        yield Worker(url, log_path, process)


def ask(worker: Worker, text: str) -> tuple[str, int, int]:
    """The greedy answer to `text`, its prompt tokens and cached prompt tokens."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"{text}\nWhat weighs the most?"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    response = httpx.post(f"{worker.url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    reply = response.json()
    usage = reply["usage"]
    return (
        reply["choices"][0]["message"]["content"],
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def test_a_prefix_evicted_from_the_only_slot_comes_back_from_host_memory(smollm2_path: Path, tmp_path: Path) -> None:
    with running(smollm2_path, tmp_path) as worker:
        cold_answer, prompt_a, cached_cold = ask(worker, A)
        _, prompt_b, cached_b = ask(worker, B)  # overwrites the slot: A's state is saved first
        answer, prompt_again, cached = ask(worker, A)
        health = worker.health()
        log = worker.log()
    assert health["prompt_cache"]["entries"] >= 1 and health["prompt_cache"]["bytes"] > 0, health
    assert prompt_a > 600 and prompt_b > 600 and cached_cold < 64 and cached_b < 64, (prompt_a, cached_cold, cached_b)
    assert prompt_again == prompt_a
    assert cached >= prompt_a - 8, (prompt_a, cached)  # only the tokens after the saved prefix are prefilled
    assert answer == cold_answer  # a restored state decodes exactly as its cold prefill did
    assert "saved" in log and "restored" in log, log


def test_off_with_zero(smollm2_path: Path, tmp_path: Path) -> None:
    with running(smollm2_path, tmp_path, "--prompt-cache-mib", "0") as worker:
        ask(worker, A)
        ask(worker, B)
        _, prompt_a, cached = ask(worker, A)
        log = worker.log()
    assert cached < 64, (prompt_a, cached)
    assert "restored" not in log


def test_the_bound_evicts_the_oldest_state(smollm2_path: Path, tmp_path: Path) -> None:
    with running(smollm2_path, tmp_path, "--prompt-cache-mib", SMALL_CACHE_MIB) as worker:
        ask(worker, A)
        ask(worker, B)  # saves A
        ask(worker, C)  # saves B; both do not fit: A (the oldest) goes
        _, prompt_a, cached_a = ask(worker, A)  # saves C, evicting B
        _, prompt_c, cached_c = ask(worker, C)
    assert cached_a < 64, (prompt_a, cached_a)
    assert cached_c >= prompt_c - 8, (prompt_c, cached_c)


def test_a_slot_is_copied_only_after_the_engine_has_idled_its_idle_time(smollm2_path: Path, tmp_path: Path) -> None:
    """`--prompt-cache-idle-s` (issue 41): an agent's next turn that comes back within it finds its slot as it
    left it, and no copy was made (the worker before it copied the slot as soon as the turn ended, and on a GPU
    the next turn waited behind that copy); once the engine has idled that long, the slot is copied."""
    idle_s = 6.0
    with running(smollm2_path, tmp_path, "--prompt-cache-idle-s", f"{idle_s:g}") as worker:
        ask(worker, A)
        _, prompt, cached = ask(worker, f"{A}\nWhat weighs the most?\nCount again.")  # the next turn
        ended = time.monotonic()
        early = worker.health()["prompt_cache"]
        while (later := worker.health()["prompt_cache"])["saved_idle_total"] == 0:
            assert time.monotonic() < ended + idle_s + 30, later
            time.sleep(0.2)
        waited = time.monotonic() - ended
    assert cached >= prompt - 40, (prompt, cached)  # the slot kept the first turn
    assert early["saved_total"] == 0, early  # nothing copied between the turns
    assert later["saved_total"] == later["saved_idle_total"] == 1 and waited >= idle_s / 2, (later, waited)
