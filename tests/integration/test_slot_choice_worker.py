"""A chat frontend's session replayed on the real worker (two slots): each message, carrying a long system
prompt, is followed by its background tasks (title, tags, follow-ups: short prompts sharing nothing with it),
as Open WebUI sends them. The next message must find its prefix still cached (issue 22)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_llamacpp_worker import MODEL, Worker, start_worker, stop

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


@pytest.fixture(scope="module")
def worker(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    log_path = tmp_path_factory.mktemp("slot-choice") / "worker.log"
    process, url = start_worker(smollm2_path, log_path, "--ctx", "4096", "--slots", "2", "--n-threads", "1")
    worker = Worker(url, log_path, process)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, worker.log()
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "worker not healthy in 120 s"
            time.sleep(0.1)
        yield worker
    finally:
        stop(process)


def chat(url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_background_tasks_leave_the_conversations_prefix_cached(worker: Worker) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    cached_per_message: list[tuple[int, int]] = []
    for question in ("Which tool gets item 7?", "And item 12?", "What does verbose do?"):
        history.append({"role": "user", "content": question})
        answer = chat(worker.url, history)
        usage = answer["usage"]
        cached_per_message.append((usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]))
        history.append({"role": "assistant", "content": answer["choices"][0]["message"]["content"]})
        transcript = "\n".join(f"{m['role']}: {m['content']}" for m in history[1:])
        for task in TASKS:
            chat(worker.url, [{"role": "user", "content": f"{task}\n<chat_history>\n{transcript}\n</chat_history>"}])
    # Every message after the first re-uses at least the system prompt and the earlier turns.
    first_prompt = cached_per_message[0][0]
    for prompt, cached in cached_per_message[1:]:
        assert cached >= first_prompt - 8, cached_per_message
        assert cached < prompt
