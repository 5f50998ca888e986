"""The worker's HTTP kit (`backends.llamacpp.worker.httpkit`): body parsing with parameter paths, the error
envelope in the gateway's codes, the one disconnect watcher and the SSE response, over a scripted ASGI channel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.errors import STATUS, ErrorCode
from backends.llamacpp.worker.httpkit import (
    EventStream,
    WorkerError,
    parse_body,
    until_disconnected,
    watch_disconnect,
)
from backends.request import EngineEmbeddingRequest, EngineRequest
from gateway.errors import GatewayError

# --- body parsing ------------------------------------------------------------------------------------------


def refusal(raw: bytes, model: type[Any] = EngineEmbeddingRequest, unions: dict[str, str] | None = None) -> WorkerError:
    with pytest.raises(WorkerError) as info:
        parse_body(raw, model, unions)
    assert info.value.status == 400
    return info.value


def test_parse_errors_name_the_parameter() -> None:
    assert refusal(b'{"model": "m"}').param == "input"
    assert refusal(b'{"model": "m"}').message == "missing required parameter: input"
    assert refusal(b'{"model": "m", "input": "a", "dimensions": 0}').param == "dimensions"
    assert refusal(b'{"model": "m", "input": "a", "extra": 1}').param == "extra"
    assert refusal(b'{"model": "m", "input": "a", "encoding_format": "hex"}').param == "encoding_format"


def test_a_body_that_is_no_json_object_is_refused_by_what_it_is() -> None:
    broken = refusal(b"{nope")
    assert (broken.param, broken.code) == (None, ErrorCode.INVALID_JSON)
    assert broken.message.startswith("invalid JSON body")
    for raw in (b"[1]", b'"text"', b"3"):
        error = refusal(raw)
        assert (error.message, error.code) == ("the request body must be a JSON object", ErrorCode.INVALID_REQUEST)


def test_a_union_field_gets_its_own_message() -> None:
    error = refusal(b'{"model": "m", "input": ["a", 1]}', unions={"input": "input is one of four forms"})
    assert (error.param, error.message) == ("input", "input is one of four forms")


def test_chat_bodies_get_the_same_paths_as_embedding_bodies() -> None:
    """Both workers parse through one function: a nested chat field is named as the client wrote it."""
    error = refusal(b'{"model": "m", "messages": [{"role": "user", "content": "a"}], "n": 0}', EngineRequest)
    assert error.param == "n"
    error = refusal(b'{"model": "m", "messages": "hi"}', EngineRequest)
    assert error.param == "messages"
    good = parse_body(b'{"model": "m", "messages": [{"role": "user", "content": "a"}]}', EngineRequest)
    assert good.is_chat


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [ErrorCode.QUEUE_FULL, ErrorCode.WORKER_LOADING, ErrorCode.CONTEXT_LENGTH_EXCEEDED, ErrorCode.UNSUPPORTED_TASK],
)
def test_a_worker_error_renders_as_the_gateway_renders_the_same_code(code: ErrorCode) -> None:
    worker = WorkerError(code, "why", param="p")
    gateway = GatewayError(code, "why", param="p")
    assert (worker.status, worker.body()) == (gateway.status, gateway.body())
    response = worker.response()
    assert response.status_code == STATUS[code]


# --- the disconnect watcher --------------------------------------------------------------------------------


class ScriptedChannel:
    """Stands for uvicorn's ASGI receive channel: the request body, then `http.disconnect` once released."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


async def test_a_client_that_leaves_calls_the_callback_while_the_block_waits() -> None:
    channel = ScriptedChannel()
    calls: list[str] = []
    async with watch_disconnect(channel.receive, lambda: calls.append("gone")):
        channel.gone.set()
        for _ in range(10):
            await asyncio.sleep(0)
    assert calls == ["gone"]


async def test_no_callback_when_the_block_ends_first() -> None:
    channel = ScriptedChannel()
    calls: list[str] = []
    async with watch_disconnect(channel.receive, lambda: calls.append("gone")):
        await asyncio.sleep(0)
    channel.gone.set()
    await asyncio.sleep(0)
    assert calls == []


async def test_until_disconnected_gives_the_result_or_cancels_the_future() -> None:
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()
    loop.call_soon(done.set_result, 7)
    assert await until_disconnected(done, ScriptedChannel().receive) == 7

    channel = ScriptedChannel()
    pending: asyncio.Future[int] = loop.create_future()
    loop.call_soon(channel.gone.set)
    assert await asyncio.wait_for(until_disconnected(pending, channel.receive), 10) is None
    assert pending.cancelled()

    failing: asyncio.Future[int] = loop.create_future()
    loop.call_soon(failing.set_exception, RuntimeError("engine closed"))
    with pytest.raises(RuntimeError, match="engine closed"):
        await until_disconnected(failing, ScriptedChannel().receive)


async def test_an_event_stream_stops_the_request_when_the_client_leaves_between_frames() -> None:
    channel = ScriptedChannel()
    stopped = asyncio.Event()
    stops: list[str] = []

    def on_disconnect() -> None:
        stops.append("stop")
        stopped.set()

    async def frames() -> AsyncIterator[bytes]:
        yield b"data: 1\n\n"
        channel.gone.set()
        await stopped.wait()  # a generation waiting for its next token: only the watcher can end it
        yield b"data: [DONE]\n\n"

    # Without the watcher the stream would wait forever: the time-out turns that into a failure.
    await asyncio.wait_for(EventStream(frames(), on_disconnect)({"type": "http"}, channel.receive, channel.send), 10)
    assert stops[0] == "stop"
    assert channel.sent[0]["type"] == "http.response.start"
    assert dict(channel.sent[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert [m.get("body") for m in channel.sent[1:]] == [b"data: 1\n\n", b"data: [DONE]\n\n", b""]
