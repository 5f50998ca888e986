"""Forced tool calls on the real llama.cpp worker (SmolLM2): whatever is sampled, and wherever max_tokens cuts
it, a reply held to a call grammar comes back as `tool_calls`, never as `<tool_call>` text (issue 26)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.e2e.test_tools import frontend_tools
from tests.integration.test_llamacpp_worker import MODEL, client, stream_events, worker

__all__ = ["client", "worker"]  # the worker fixtures, used here by name

pytestmark = pytest.mark.integration

ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "Find me something fun to do in Paris today."}]  # fmt: skip
REPETITIONS = 12
TOOLS = 8  # Open WebUI-style tools that fit the module worker's 1,024-token context


def forced(**params: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": ASK, "tools": frontend_tools(TOOLS), "tool_choice": "required",
            "parallel_tool_calls": False, **params}  # fmt: skip


async def reply(client: httpx.AsyncClient, body: dict[str, Any]) -> tuple[str | None, list[dict[str, Any]], str]:
    """(content, tool calls, finish_reason) of a unary or streamed chat request."""
    if not body.get("stream"):
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        return choice["message"]["content"], choice["message"].get("tool_calls") or [], choice["finish_reason"]
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        chunks = [e for e in await stream_events(response) if e != "[DONE]"]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        for part in (chunk["choices"][0]["delta"].get("tool_calls") or []) if chunk["choices"] else []:
            call = calls.setdefault(part["index"], {"function": {"name": "", "arguments": ""}})
            call["function"]["name"] += part["function"].get("name") or ""
            call["function"]["arguments"] += part["function"].get("arguments") or ""
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    return content or None, list(calls.values()), reasons[-1]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_forced_call_cut_by_max_tokens_is_a_call_with_finish_reason_length(
    client: httpx.AsyncClient, stream: bool
) -> None:
    content, calls, reason = await reply(client, forced(max_tokens=14, temperature=0, stream=stream))
    assert reason == "length" and content is None
    assert len(calls) == 1 and calls[0]["function"]["name"] in {t["function"]["name"] for t in frontend_tools(TOOLS)}


async def test_forced_calls_sampled_many_times_always_come_back_as_calls(client: httpx.AsyncClient) -> None:
    for seed in range(REPETITIONS):
        body = forced(max_tokens=128, temperature=1.0, seed=seed, stream=seed % 2 == 1)
        content, calls, reason = await reply(client, body)
        assert content is None and len(calls) == 1, (seed, content, calls)
        if reason == "tool_calls":
            assert isinstance(json.loads(calls[0]["function"]["arguments"]), dict), (seed, calls)
        else:
            assert reason == "length", (seed, reason)
