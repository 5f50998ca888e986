"""Claude Code's changing billing line no longer costs the session its cache: the recorded Claude Code request
with three different suffixes, through the real Anthropic SDK, `voltgate serve` and our llama.cpp worker on the
real SmolLM2; the cached tokens each answer reports are the worker's own count."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.clients.fixtures import load
from tests.conftest import LONG_PROMPT_KV, LONG_PROMPT_THREADS, free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config

pytestmark = pytest.mark.e2e

TOOLS_CHARS = 6000  # the recorded tools kept (the first ones, whole): a prefix of ~1.5k tokens, not ~6k


@pytest.fixture(scope="module")
def prefix_gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("prefix")
    engine = {"n_threads": LONG_PROMPT_THREADS, "cache_type": LONG_PROMPT_KV}
    entry = model_entry(smollm2_path, concurrency=1, llamacpp=engine)
    with running_gateway(write_config(tmp, smollm2_path, free_port(), models=[entry]), tmp / "gateway.log") as gw:
        yield gw


def claude_code_request(suffix: str, ask: str = "Say hello") -> dict[str, Any]:
    """The recorded first turn of Claude Code 2.1.197 (its system blocks, messages, metadata and first tools), the
    billing line's suffix set to `suffix` and the user's words to `ask`."""
    body = copy.deepcopy(load("claude_first_turn")["exchanges"][0]["body"])
    billing = body["system"][0]
    assert billing["text"] == "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;"
    billing["text"] = billing["text"].replace(".1c0;", f".{suffix};")
    body["messages"][0]["content"][1]["text"] = ask
    tools, size = [], 0
    for tool in body["tools"]:
        size += len(json.dumps(tool))
        if size > TOOLS_CHARS:
            break
        tools.append(tool)
    keep = ("system", "messages", "metadata")
    return {**{k: body[k] for k in keep}, "tools": tools, "model": MODEL, "max_tokens": 1}


def test_three_billing_suffixes_share_the_cached_prefix(prefix_gateway: Gateway) -> None:
    client = anthropic.Anthropic(base_url=prefix_gateway.url, api_key="unused", max_retries=0, timeout=600)
    first = client.messages.create(**claude_code_request("1c0"))
    prompt = first.usage.input_tokens + (first.usage.cache_read_input_tokens or 0)
    assert prompt > 1000  # the recorded system, tools and messages: a prefix worth caching

    with client.messages.stream(**claude_code_request("c40")) as stream:  # streamed: message_delta's usage
        second = stream.get_final_message()
    assert second.usage.input_tokens + (second.usage.cache_read_input_tokens or 0) == prompt  # the line is gone
    assert second.usage.cache_read_input_tokens == prompt - 1  # all but the last token, as for the same request

    third = client.messages.create(**claude_code_request("123", ask="Say goodbye"))
    cached = third.usage.cache_read_input_tokens or 0
    assert prompt - 80 < cached < third.usage.input_tokens + cached - 1  # cached up to "Say", then prefilled

    metrics = httpx.get(prefix_gateway.url + "/metrics", timeout=10).text
    line = f'voltgate:prompt_neutralised_total{{model="{MODEL}",rule="claude_code_billing_header"}} 3.0'
    assert line in metrics


@pytest.mark.slow  # four ~1.5k-token prompts on SmolLM2: about 90 s on a 2-core host
def test_cached_tokens_are_reported_on_every_api_and_counted_per_model(prefix_gateway: Gateway) -> None:
    """The same long system prompt through chat (whole and streamed), Responses and Messages, each with the real
    SDK: from the second request on the worker's cache serves all but the new tail, and every API says so."""
    system = "You are a careful assistant. These tools exist:\n" + json.dumps(claude_code_request("1c0")["tools"])
    openai_client = prefix_gateway.client()
    ask = [{"role": "system", "content": system}, {"role": "user", "content": "Say hi"}]
    first = openai_client.chat.completions.create(model=MODEL, messages=ask, max_tokens=1)  # type: ignore[arg-type]
    assert first.usage is not None and first.usage.prompt_tokens > 1000
    prompt = first.usage.prompt_tokens
    chunks = list(openai_client.chat.completions.create(model=MODEL, messages=ask, max_tokens=1, stream=True,  # type: ignore[call-overload]
                                                        stream_options={"include_usage": True}))  # fmt: skip
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == prompt - 1

    response = openai_client.responses.create(model=MODEL, instructions=system, input="Say hi", max_output_tokens=16)
    assert response.usage is not None and response.usage.input_tokens_details.cached_tokens > prompt - 20

    anthropic_client = anthropic.Anthropic(base_url=prefix_gateway.url, api_key="unused", max_retries=0, timeout=600)
    message = anthropic_client.messages.create(model=MODEL, max_tokens=1, system=system,
                                               messages=[{"role": "user", "content": "Say hi"}])  # fmt: skip
    assert message.usage.cache_read_input_tokens is not None and message.usage.cache_read_input_tokens > prompt - 20

    metrics = httpx.get(prefix_gateway.url + "/metrics", timeout=10).text
    series = {
        line.split(" ")[0]: float(line.split(" ")[1]) for line in metrics.splitlines() if line.startswith("voltgate:")
    }
    label = f'{{model="{MODEL}"}}'
    assert series[f"voltgate:prompt_tokens_cached_total{label}"] > 2 * prompt
    assert series[f"voltgate:prompt_tokens_cache_reported_total{label}"] >= 4 * prompt
    assert series[f"voltgate:prefill_seconds_saved_total{label}"] > 0
