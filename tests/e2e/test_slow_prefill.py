"""A slow first token on the real SmolLM2 worker: what agents' stream watchdogs see, and the gateway's own.

A long prompt (about 1,500 tokens, each test its own so no prefix cache helps) prefills for seconds on this
CPU. The gateway sends a keep-alive every 0.1 s (`keepalive_interval_s`) that each client library yields as
an event: a chat chunk with no choices (openai SDK), a Responses `keepalive` event (openai SDK), a Messages
`ping` (anthropic SDK); and its `upstream_timeout_s` of 2 s, far below the prefill, does not cut the stream,
because the worker says `: prefilling` every half second until its first token (docs/agents.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from tests.conftest import LONG_PROMPT_KV, free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

UPSTREAM_TIMEOUT_S = 2.0
KEEPALIVE_S = 0.1


@pytest.fixture(scope="module")
def slow(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("slow-prefill")
    entry = model_entry(smollm2_path, concurrency=1, llamacpp={"n_threads": 1, "cache_type": LONG_PROMPT_KV})
    config = write_config(tmp, smollm2_path, free_port(), models=[entry], keepalive_interval_s=KEEPALIVE_S,
                          upstream_timeout_s=UPSTREAM_TIMEOUT_S)  # fmt: skip
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


def long_prompt(tag: str) -> str:
    """About 1,500 tokens that start with `tag`, so no earlier test's prompt is a cached prefix of it."""
    facts = " ".join(f"Item {i} of the {tag} list is a {('red', 'blue', 'green')[i % 3]} box." for i in range(120))
    return f"{tag}: {facts}\nWhich colour is item 7? Answer in one word."


def waited_past_the_timeout(started: float, first_token_at: float | None) -> None:
    """The test shows something only if the prefill outlasted `upstream_timeout_s`."""
    assert first_token_at is not None, "no token came"
    if first_token_at - started <= UPSTREAM_TIMEOUT_S:
        pytest.skip(f"the prompt prefilled in {first_token_at - started:.1f} s, within upstream_timeout_s")


def test_chat_stream_keepalives_are_chunks_the_openai_sdk_yields(slow: Gateway) -> None:
    started, first_token_at, keepalives, text = time.monotonic(), None, 0, ""
    stream = slow.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": long_prompt("chat")}], max_tokens=4, stream=True,
        temperature=0, stream_options={"include_usage": True},
    )  # fmt: skip
    for chunk in stream:
        if not chunk.choices and chunk.usage is None:
            keepalives += 1
            assert chunk.id.startswith("chatcmpl-") and chunk.model == MODEL
        for choice in chunk.choices:
            if choice.delta.content and first_token_at is None:
                first_token_at = time.monotonic()
            text += choice.delta.content or ""
    waited_past_the_timeout(started, first_token_at)
    assert keepalives >= 2 and text


def test_responses_stream_keepalives_are_keepalive_events_not_the_whole_response(slow: Gateway) -> None:
    started, first_token_at, kinds = time.monotonic(), None, []
    stream = slow.client().responses.create(model=MODEL, input=long_prompt("responses"), max_output_tokens=4,
                                            stream=True, temperature=0)  # fmt: skip
    for event in stream:
        kinds.append(event.type)
        if event.type == "response.output_text.delta" and first_token_at is None:
            first_token_at = time.monotonic()
    waited_past_the_timeout(started, first_token_at)
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")  # 4 tokens may end it early
    assert kinds.count("keepalive") >= 2 and kinds.count("response.in_progress") == 1


def test_messages_stream_keepalives_are_pings_and_the_prefill_is_no_silence(slow: Gateway) -> None:
    """The SDK reads the pings and skips them (as it does Anthropic's own): they are counted on its raw stream."""
    client = anthropic.Anthropic(base_url=slow.url, api_key="unused", max_retries=0, timeout=300)
    started, first_token_at, events = time.monotonic(), None, []
    with client.messages.with_streaming_response.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": long_prompt("msg")}], stream=True,
        extra_body={"temperature": 0},
    ) as response:  # fmt: skip
        for line in response.iter_lines():
            if line.startswith("event: "):
                events.append(line.removeprefix("event: "))
                if events[-1] == "content_block_delta" and first_token_at is None:
                    first_token_at = time.monotonic()
    waited_past_the_timeout(started, first_token_at)
    assert events.count("ping") >= 2 and events[-1] == "message_stop"
