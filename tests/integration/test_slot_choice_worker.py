"""A chat frontend's session replayed on the real worker (two slots, then one): each message, carrying a long system
prompt, is followed by its background tasks (title, tags, follow-ups: short prompts sharing nothing with it),
as Open WebUI sends them. The next message must find its prefix still cached (issue 22)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import LONG_PROMPT_KV, LONG_PROMPT_THREADS
from tests.integration.test_llamacpp_worker import Worker
from tests.worker_process import MODEL, start_worker, stop, wait_ready

pytestmark = pytest.mark.integration

# Stands in for Open WebUI's tool definitions rendered into the system prompt (~1,500 tokens).
SYSTEM = "You can call these tools. " + " ".join(
    f"Tool {i}: get_item_{i}(id: string, verbose: boolean) returns item {i} from the catalogue." for i in range(60)
)
TASKS = [
    "### Task: Generate a concise, 3-5 word title with an emoji summarizing the chat history.",
    "### Task: Generate 1-3 broad tags categorizing the main themes of the chat history.",
    "### Task: Suggest 3-5 relevant follow-up questions the user might naturally ask next.",
]


def boot(smollm2_path: Path, log_path: Path, *extra: str) -> Worker:
    # f16 KV: the replay is about which prefix stays cached, not batched bit-equality, and on an AVX2-only CPU
    # the default bf16 prefills these ~1.8k-token prompts far slower (tests/conftest.py, LONG_PROMPT_KV)
    threads = str(LONG_PROMPT_THREADS)
    process, url = start_worker(
        smollm2_path, log_path, "--ctx", "4096", "--n-threads", threads, "--cache-type", LONG_PROMPT_KV, *extra
    )
    try:
        wait_ready(url, process, log_path, 120)
    except AssertionError:
        stop(process)
        raise
    return Worker(url, log_path, process)


@pytest.fixture(scope="module")
def worker(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    worker = boot(smollm2_path, tmp_path_factory.mktemp("slot-choice") / "worker.log", "--slots", "2")
    yield worker
    stop(worker.process)


def chat(url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return dict(response.json())


def replay(url: str, messages: int = 3) -> list[tuple[int, int]]:
    """Three messages (or the first `messages`), each followed by its background tasks; (prompt, cached) tokens
    of each message."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    cached_per_message: list[tuple[int, int]] = []
    for question in ("Which tool gets item 7?", "And item 12?", "What does verbose do?")[:messages]:
        history.append({"role": "user", "content": question})
        answer = chat(url, history)
        usage = answer["usage"]
        cached_per_message.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
        history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        transcript = "\n".join(f"{m['role']}: {m['content']}" for m in history[1:])
        for task in TASKS:
            chat(url, [{"role": "user", "content": f"{task}\n<chat_history>\n{transcript}\n</chat_history>"}])
    return cached_per_message


def assert_prefix_kept(cached_per_message: list[tuple[int, int]]) -> None:
    """Every message after the first re-uses at least the system prompt and the earlier turns."""
    first_prompt = cached_per_message[0][0]
    for prompt, cached in cached_per_message[1:]:
        assert cached >= first_prompt - 8, cached_per_message
        assert cached < prompt


def test_background_tasks_leave_the_conversations_prefix_cached(worker: Worker) -> None:
    assert_prefix_kept(replay(worker.url))


def test_with_one_slot_the_prefix_comes_back_from_host_memory(
    smollm2_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One slot: every background task overwrites the conversation's KV, saved to host memory and restored
    for the next message (`--prompt-cache-mib`); with the cache off the same replay re-prefills it all."""
    measured: dict[str, list[tuple[int, int]]] = {}
    # With the cache off every message is a cold prefill of the whole conversation: two messages show it (the
    # second's prefix is gone) at two thirds of the time three take.
    for mib, messages in (("2048", 3), ("0", 2)):
        worker = boot(smollm2_path, tmp_path / f"worker-{mib}.log", "--slots", "1", "--prompt-cache-mib", mib)
        try:
            measured[mib] = replay(worker.url, messages)
        finally:
            stop(worker.process)
    with capsys.disabled():
        print(f"\n(prompt, cached) tokens per message, 1 slot: cache on {measured['2048']}, off {measured['0']}")
    assert_prefix_kept(measured["2048"])
    assert all(cached < 64 for _, cached in measured["0"][1:]), measured["0"]


def test_an_ended_longer_conversation_does_not_hold_its_slot_against_the_live_one(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """Two slots, host cache off (so every state is precious, as one too large for the cache is): a longer
    conversation that has ended holds one slot. The live chat's tasks must overwrite it, not the chat: the
    GPU replay of 2 slots of KV f16 lost Open WebUI's whole context every turn so."""
    ended = "These are the rules of the catalogue. " + " ".join(
        f"Rule {i}: an order for part {i} ships from depot {i % 7} within {i % 5 + 1} days." for i in range(90)
    )
    worker = boot(smollm2_path, tmp_path / "worker.log", "--slots", "2", "--prompt-cache-mib", "0")
    try:
        before = chat(worker.url, [{"role": "system", "content": ended}, {"role": "user", "content": "Rule 3?"}])
        measured = replay(worker.url, 2)
    finally:
        stop(worker.process)
    assert before["usage"]["prompt_tokens"] > measured[0][0] + 64, (before["usage"], measured)
    assert_prefix_kept(measured)
