"""The requests Codex CLI and Claude Code really send (recorded, tests/fixtures/clients/), replayed against
`voltgate serve` on the real SmolLM2: each must be served, with the exact event sequence each client needs.

Codex's: `namespace` and `web_search` tools, no `max_output_tokens`, `store: false` with the whole history
resent (function_call / function_call_output items, a namespace's calls by `namespace` + `name`). Claude Code's:
Claude model names (aliases here), `max_tokens: 64000` (clamped by `server.max_tokens_cap`), a mid-conversation
`role: "system"` message, `thinking: adaptive`, `context_management`, `?beta=true` on the path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from tests.clients.fixtures import load
from tests.clients.recorder import sse_events
from tests.conftest import LONG_PROMPT_KV, LONG_PROMPT_THREADS, free_port
from tests.e2e.conftest import (
    MODEL,
    Gateway,
    model_entry,
    running_gateway,
    write_config,
)
from tests.e2e.streams import COUNTING
from tests.responses_schema import assert_event_matches

pytestmark = pytest.mark.e2e

CAP = 24  # server.max_tokens_cap (clamp): every agent turn here is short
FRONTEND_DEFAULT = 4  # the model's default_max_tokens: for chat requests that set no limit
CLAUDE_NAMES = ["claude-opus-4-8", "claude-sonnet-4-6", "claude-haiku-4-5", "claude-haiku-4-5-20251001"]
ANTHROPIC_EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


@pytest.fixture(scope="module")
def agents(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("agents")
    entry = model_entry(smollm2_path, context=8192, concurrency=2, aliases=["smollm2", *CLAUDE_NAMES],
                        default_max_tokens=FRONTEND_DEFAULT, llamacpp={"n_threads": LONG_PROMPT_THREADS,
                        "max_queue": 64, "cache_type": LONG_PROMPT_KV})  # fmt: skip
    config = write_config(tmp, smollm2_path, free_port(), models=[entry], max_tokens_cap=CAP,
                          max_tokens_over_cap="clamp", max_body_bytes=4 << 20)  # fmt: skip
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


def replay(gateway: Gateway, exchange: dict[str, Any]) -> tuple[httpx.Response, list[dict[str, Any]]]:
    """POST a recorded request as the client sent it; the response and its SSE events (`data` parsed)."""
    headers = {**exchange["headers"], "authorization": "Bearer unused", "x-api-key": "unused"}
    response = httpx.post(gateway.url + exchange["path"], json=exchange["body"], headers=headers, timeout=600)
    events = [e["data"] for e in sse_events(response.content) if isinstance(e.get("data"), dict)]
    return response, events


def codex_exchanges(name: str) -> list[dict[str, Any]]:
    return [e for e in load(name)["exchanges"] if e["path"].startswith("/v1/responses") and e["reply"] == "gateway"]


def assert_codex_stream(response: httpx.Response, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What Codex reads: an SSE stream of valid events, numbered in order, that ends in response.completed or
    response.incomplete; web search dropped, said in the header. Returns the final Response."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-voltgate-dropped-tools"] == "web_search"
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    for event in events:
        assert_event_matches(event)
    final: dict[str, Any] = events[-1]["response"]
    assert final["max_output_tokens"] == CAP  # the limit served, echoed (Codex sent none)
    assert {tool["type"] for tool in final["tools"]} >= {"function", "namespace"}
    return final


@pytest.mark.parametrize("fixture", ["codex_first_turn", "codex_tool_round_trip", "codex_resumed"])
def test_codex_requests_are_served_with_the_events_codex_reads(agents: Gateway, fixture: str) -> None:
    exchanges = codex_exchanges(fixture)
    assert exchanges
    for exchange in exchanges:
        body = exchange["body"]
        assert "max_output_tokens" not in body and body["store"] is False
        assert {"namespace", "web_search"} <= {tool["type"] for tool in body["tools"]}
        final = assert_codex_stream(*replay(agents, exchange))
        assert final["usage"]["input_tokens"] > 0
    assert "served without the hosted tools web_search" in agents.log()


def test_a_resent_namespaced_call_and_its_output_are_accepted(agents: Gateway) -> None:
    """Codex resends the whole history (store: false): a namespace's call comes back with `namespace`."""
    exchange = codex_exchanges("codex_tool_round_trip")[-1]
    body = json.loads(json.dumps(exchange["body"]))
    call = {"type": "function_call", "call_id": "call_ns", "namespace": "multi_agent_v1", "name": "spawn_agent",
            "arguments": json.dumps({"message": "look around"})}  # fmt: skip
    output = {"type": "function_call_output", "call_id": "call_ns", "output": "agent-1 started"}
    body["input"] = [*body["input"], call, output]
    final = assert_codex_stream(*replay(agents, {**exchange, "body": body}))
    # The same history was just served (the test before): its prefix is reported as cached, as OpenAI does.
    assert 0 < final["usage"]["input_tokens_details"]["cached_tokens"] < final["usage"]["input_tokens"]


def test_default_max_tokens_bounds_chat_requests_but_not_an_agents_responses_turn(agents: Gateway) -> None:
    """A chat frontend's background task (no max_tokens) stays short; a Responses turn that sets no limit gets
    up to the context, bounded here by the cap, which the Response echoes (it was cut at 512 and echoed null)."""
    counting = [{"role": "user", "content": COUNTING}]
    chat = httpx.post(agents.base_url + "/chat/completions", json={"model": MODEL, "messages": counting,
                      "temperature": 0}, timeout=300).json()  # fmt: skip
    assert chat["usage"]["completion_tokens"] == FRONTEND_DEFAULT
    turn = httpx.post(agents.base_url + "/responses", json={"model": MODEL, "input": COUNTING, "temperature": 0},
                      timeout=300).json()  # fmt: skip
    assert turn["usage"]["output_tokens"] > FRONTEND_DEFAULT
    assert turn["max_output_tokens"] == CAP and turn["usage"]["output_tokens"] <= CAP


def claude_exchanges(name: str) -> list[dict[str, Any]]:
    return [e for e in load(name)["exchanges"] if e["path"].startswith("/v1/messages") and e["reply"] == "gateway"]


def assert_claude_stream(response: httpx.Response, events: list[dict[str, Any]]) -> None:
    """What Claude Code reads: message_start (then ping; only pings before it, while the prompt waits for a slot)
    with the prompt's usage, balanced content blocks, message_delta with a stop_reason and the same input usage,
    message_stop; every event valid for the anthropic SDK."""
    assert response.status_code == 200, response.text
    kinds = [e["type"] for e in events]
    opened = kinds.index("message_start")
    assert set(kinds[:opened]) <= {"ping"} and kinds[opened + 1] == "ping"
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") >= 1
    for event in events:
        if event["type"] != "ping":  # the SDK reads pings and yields none: no type of its own
            ANTHROPIC_EVENTS.validate_python(event)
    delta = events[-2]
    assert delta["delta"]["stop_reason"] in ("end_turn", "max_tokens", "tool_use")
    assert delta["usage"]["input_tokens"] > 0 and delta["usage"]["output_tokens"] >= 1
    start = events[opened]["message"]["usage"]
    assert start["input_tokens"] > 0 and start["output_tokens"] == 0
    for key in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"):
        assert start[key] == delta["usage"][key]


@pytest.mark.parametrize("fixture", ["claude_first_turn", "claude_tool_round_trip", "claude_resumed"])
def test_claude_code_requests_are_served_with_the_events_it_reads(agents: Gateway, fixture: str) -> None:
    exchanges = claude_exchanges(fixture)
    assert exchanges
    for exchange in exchanges:
        body = exchange["body"]
        if body.get("stream"):
            assert_claude_stream(*replay(agents, exchange))
            continue
        response, _ = replay(agents, exchange)  # a non-streamed side request (titles, count_tokens)
        assert response.status_code == 200, response.text
    first = claude_exchanges("claude_first_turn")[-1]["body"]
    assert first["model"] in CLAUDE_NAMES and first["max_tokens"] > CAP
    assert any(m["role"] == "system" for m in first["messages"])
