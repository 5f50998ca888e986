"""An Open WebUI session through `voltgate serve` on SmolLM2, with Open WebUI 0.12.4's 36 built-in tools on
every message (tests/fixtures/clients/openwebui_builtin_tools.json) and its title, tags and follow-up tasks
after each answer, as Open WebUI sends them. What the context allows and what the prefix cache keeps is
measured on the real prompt, not a stand-in: the tools fit with room for the conversation, and the next
message finds the tools' prefix still cached after the background tasks (issue 22, items 11 and 12).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.clients.fixtures import load
from tests.conftest import LONG_PROMPT_KV, LONG_PROMPT_THREADS, free_port
from tests.e2e.conftest import (
    MODEL,
    Gateway,
    model_entry,
    running_gateway,
    write_config,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]  # two ~4.7k-token prefills on a CPU

FIXTURE = load("openwebui_builtin_tools")
CONTEXT = 8192  # the default config's context for SmolLM2


@pytest.fixture(scope="module", params=[2, 1], ids=["2-slots", "1-slot"])
def gateway(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Gateway]:
    """2 slots: the tasks take the other slot. 1 slot: they overwrite the tools prefix, which the worker
    saves to host memory and restores for the next message (`llamacpp.prompt_cache_mib`)."""
    tmp = tmp_path_factory.mktemp("open-webui")
    entry = model_entry(smollm2_path, context=CONTEXT, concurrency=request.param, default_max_tokens=48)
    entry["llamacpp"] = {"n_threads": LONG_PROMPT_THREADS, "max_queue": 64, "prompt_cache_mib": 1024,
                         "cache_type": LONG_PROMPT_KV}  # fmt: skip
    with running_gateway(write_config(tmp, smollm2_path, free_port(), models=[entry]), tmp / "gateway.log") as gw:
        yield gw


def _message(client: openai.OpenAI, messages: list[dict[str, Any]]) -> tuple[str, Any]:
    """One chat message as Open WebUI sends it (streamed, the tools, no tool_choice, no max_tokens)."""
    body = FIXTURE["exchanges"][0]["body"]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, tools=body["tools"], stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks[-1].usage


def _background_tasks(client: openai.OpenAI, history: list[dict[str, Any]]) -> None:
    transcript = "\n".join(f"{m['role'].upper()}: {m['content']}" for m in history)
    for name in ("title", "tags", "follow_ups"):
        prompt = FIXTURE["background_tasks"][name]
        for n in (2, 6):
            prompt = prompt.replace(f"{{{{MESSAGES:END:{n}}}}}", transcript)
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}])


def test_the_next_message_finds_the_tools_prefix_cached_after_the_background_tasks(gateway: Gateway) -> None:
    client = gateway.client()
    history: list[dict[str, Any]] = [dict(m) for m in FIXTURE["exchanges"][0]["body"]["messages"]]
    answer, first = _message(client, history)
    assert first.prompt_tokens < CONTEXT - 3_000  # the tools leave room for the conversation (it was 7,038)
    history.append({"role": "assistant", "content": answer or "(a tool call)"})
    _background_tasks(client, history)
    history.append({"role": "user", "content": "Thanks! What can you do for me?"})
    _, second = _message(client, history)
    cached = second.prompt_tokens_details.cached_tokens
    print(f"\nfirst prompt {first.prompt_tokens}, next prompt {second.prompt_tokens}, {cached} cached")
    # Everything up to the first user message's end was cached (the tools section, ~4,700 tokens).
    assert cached >= first.prompt_tokens - 16, (first, second)
    assert cached < second.prompt_tokens
