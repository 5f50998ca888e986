"""The worker's `stop_reason` (the stop string that ended a choice, as vLLM names it) from the engine's events to
the chat and completion bodies, streamed and whole, checked against OpenAI's schema.

The events are fed to the choices by hand (no model); this is here rather than in tests/unit because the
worker's reply modules import llama.cpp's grammar module. The real worker on SmolLM2 names the string too:
tests/integration/test_llamacpp_worker.py, "stop strings"."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from starlette.types import Message

from backends.llamacpp.worker import replies
from backends.llamacpp.worker.choices import Choice
from backends.llamacpp.worker.output import ChatOutput
from backends.llamacpp.worker.sampling import SamplingParams
from backends.llamacpp.worker.tickets import Event, Finished, GenerationRequest, TextDelta, Ticket, Usage
from backends.llamacpp.worker.tools.formats import HERMES
from backends.llamacpp.worker.wire import Kind, Renderer
from tests.openai_schema import assert_matches_openai

MODEL = "smollm2-test"
USAGE = Usage(prompt_tokens=5, completion_tokens=3, cached_tokens=0)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


# --- the choice path, events by hand ------------------------------------------------------------------


def choice(events: Sequence[Event], *, tools: bool = False) -> Choice:
    """A choice whose ticket already holds `events` (the engine's, as the outbox delivers them); with `tools`,
    its output is held to a call (`tool_choice` naming get_weather)."""
    request = GenerationRequest("r", (1, 2, 3), SamplingParams())
    ticket = Ticket(request, asyncio.get_running_loop(), lambda: None)
    for event in events:
        ticket.receive(event)
    output = ChatOutput(HERMES, ("get_weather",), forced=True) if tools else ChatOutput(None, ())
    return Choice(0, ticket, output, logprobs=False)


async def never_disconnects() -> Message:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def whole(kind: Kind, events: Sequence[Event], *, tools: bool = False) -> dict[str, Any]:
    render = Renderer(kind, "id-1", 0, MODEL)
    response = await replies.collect([choice(events, tools=tools)], render, never_disconnects)
    body: dict[str, Any] = json.loads(bytes(response.body))
    name = "CreateChatCompletionResponse" if kind == "chat" else "CreateCompletionResponse"
    assert_matches_openai(name, body)  # OpenAI's schema takes a choice's extra field
    return body


async def streamed(kind: Kind, events: Sequence[Event], *, tools: bool = False) -> list[dict[str, Any]]:
    render = Renderer(kind, "id-1", 0, MODEL)
    frames = [f async for f in replies.stream([choice(events, tools=tools)], render, include_usage=False)]
    assert frames[-1] == b"data: [DONE]\n\n"
    chunks = [json.loads(f.decode().removeprefix("data: ")) for f in frames[:-1]]
    if kind == "chat":
        for chunk in chunks:
            assert_matches_openai("CreateChatCompletionStreamResponse", chunk)
    return chunks


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_a_choice_a_stop_string_ended_names_it_whole_and_streamed(kind: Kind) -> None:
    events = [TextDelta("Monday, Tuesday"), Finished("stop", USAGE, matched="Wednesday")]
    body = await whole(kind, events)
    assert (body["choices"][0]["finish_reason"], body["choices"][0]["stop_reason"]) == ("stop", "Wednesday")
    chunks = await streamed(kind, events)
    finishing = chunks[-1]["choices"][0]
    assert (finishing["finish_reason"], finishing["stop_reason"]) == ("stop", "Wednesday")
    assert all("stop_reason" not in c["choices"][0] for c in chunks[:-1])  # only the finishing chunk says it


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("reason", ["stop", "length"])
async def test_a_choice_no_stop_string_ended_has_no_stop_reason(kind: Kind, reason: str) -> None:
    events = [TextDelta("Monday"), Finished("stop" if reason == "stop" else "length", USAGE)]
    body = await whole(kind, events)
    assert body["choices"][0]["finish_reason"] == reason and "stop_reason" not in body["choices"][0]
    chunks = await streamed(kind, events)
    assert chunks[-1]["choices"][0]["finish_reason"] == reason
    assert all("stop_reason" not in c["choices"][0] for c in chunks)


async def test_a_choice_that_ends_in_tool_calls_has_no_stop_reason() -> None:
    events = [TextDelta(CALL), Finished("stop", USAGE, matched="END")]
    body = await whole("chat", events, tools=True)
    assert body["choices"][0]["finish_reason"] == "tool_calls" and "stop_reason" not in body["choices"][0]
    chunks = await streamed("chat", events, tools=True)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all("stop_reason" not in c["choices"][0] for c in chunks)


@pytest.mark.parametrize("send", [whole, streamed])
async def test_calls_the_held_back_text_completes_make_the_finish_tool_calls(send: Any) -> None:
    """The repeat of a call ends the reply's calls (`ChatOutput.done`) even when max_tokens cut the repeat short
    and only the output's finish reads it: the finish is read after that, so it is "tool_calls", not "length"."""
    events = [TextDelta(CALL + "\n" + CALL.removesuffix("</tool_call>")), Finished("length", USAGE)]
    out = await send("chat", events, tools=True)
    last = out["choices"][0] if isinstance(out, dict) else out[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls" and "stop_reason" not in last
