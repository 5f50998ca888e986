"""The chat pass-through relayed in one task (`gateway.serving.passthrough`): keep-alives written beside the
body while the worker is silent, reads re-framed only when they split a frame, streams that always end, and a
client that leaves cancelling the upstream read (no sockets: the upstream is an `httpx.Response` over fakes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
from starlette.types import Message

from gateway.serving.passthrough import relay_direct
from gateway.serving.relay import (
    DONE_FRAME,
    KEEPALIVE_FRAME,
    ClientLine,
    KeepaliveChunk,
    RelayResponse,
    StreamStats,
)
from tests.openai_schema import assert_matches_openai

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'


class Upstream(httpx.AsyncByteStream):
    """A fake worker body: bytes, sleeps (floats) and exceptions; `closed` once the relay let go of it."""

    def __init__(self, *items: bytes | float | Exception) -> None:
        self.items = items
        self.closed = asyncio.Event()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            for item in self.items:
                if isinstance(item, float):
                    await asyncio.sleep(item)
                elif isinstance(item, Exception):
                    raise item
                else:
                    yield item
        finally:
            self.closed.set()


def relayed(
    upstream: Upstream, line: ClientLine, stats: StreamStats, done: list[str], *, include_usage: bool = True
) -> AsyncIterator[bytes]:
    async def on_done() -> None:
        done.append("done")

    response = httpx.Response(200, stream=upstream)
    return relay_direct(
        response, stats, line, model="m", include_usage=include_usage, keepalive_s=0.05, on_done=on_done
    )


async def collect(*items: bytes | float | Exception, include_usage: bool = True) -> tuple[list[bytes], StreamStats]:
    stats, done = StreamStats(), list[str]()
    out = [f async for f in relayed(Upstream(*items), ClientLine(), stats, done, include_usage=include_usage)]
    assert done, "the session is closed before [DONE]"
    return out, stats


async def serve(
    upstream: Upstream, receive_disconnect_after: float | None = None, line: ClientLine | None = None
) -> list[bytes]:
    """Run a `RelayResponse` with a line over the relay; the bodies the client got, in order."""
    line, sent = line or ClientLine(), []
    closed: list[str] = []

    async def send(message: Message) -> None:
        if message["type"] == "http.response.body":
            sent.append(message["body"])

    async def receive() -> Message:
        if receive_disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(receive_disconnect_after or 0)
        return {"type": "http.disconnect"}

    async def on_close() -> None:
        closed.append("closed")

    body = relayed(upstream, line, StreamStats(), [])
    scope = {"type": "http", "asgi": {"spec_version": "2.3"}}
    await RelayResponse(body, on_close, line=line)(scope, receive, send)
    assert closed
    return sent


async def test_silent_worker_gets_keepalives_beside_the_body() -> None:
    sent = await serve(Upstream(CHUNK, 0.2, CHUNK, DONE_FRAME))
    assert sent[0] == CHUNK and sent[-2:] == [DONE_FRAME, b""]
    assert sent.count(KEEPALIVE_FRAME) >= 2
    assert sent.index(KEEPALIVE_FRAME) > 0 and sent.count(CHUNK) == 2


async def test_worker_comments_while_it_prefills_do_not_hold_back_the_clients_keepalives() -> None:
    """The worker's `: prefilling` comments (one a second) reach no client: the keep-alive counts silence
    from the client's last write, not from the worker's last read."""
    prefilling = [item for _ in range(8) for item in (b": prefilling\n\n", 0.03)]
    sent = await serve(Upstream(CHUNK, *prefilling, CHUNK, DONE_FRAME))
    assert sent.count(KEEPALIVE_FRAME) >= 2 and b": prefilling\n\n" not in sent


async def test_keepalive_chunk_takes_the_streams_id_and_matches_openais_chunk_schema() -> None:
    role = b'data: {"id":"chatcmpl-w1","object":"chat.completion.chunk","created":7,"model":"smol",' \
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'  # fmt: skip
    line = ClientLine(KeepaliveChunk(object_name="chat.completion.chunk", id_="chatcmpl-req", model="smol-name"))
    before = json.loads(line.frame[6:])
    assert (before["id"], before["model"], before["choices"]) == ("chatcmpl-req", "smol-name", [])
    sent = await serve(Upstream(role, 0.2, CHUNK, DONE_FRAME), line=line)
    keepalives = [
        json.loads(body[6:]) for body in sent if body.startswith(b'data: {"id":"chatcmpl-w1"') and body != role
    ]
    assert len(keepalives) >= 2 and KEEPALIVE_FRAME not in sent
    for chunk in keepalives:
        assert chunk == {"id": "chatcmpl-w1", "object": "chat.completion.chunk", "created": 7, "model": "smol",
                         "choices": []}  # fmt: skip
        assert_matches_openai("CreateChatCompletionStreamResponse", chunk)


async def test_unattached_line_yields_the_keepalive_before_the_next_run() -> None:
    out, _ = await collect(0.12, CHUNK, DONE_FRAME)
    assert out == [KEEPALIVE_FRAME, CHUNK, DONE_FRAME]


async def test_reads_that_split_frames_are_reframed() -> None:
    crlf = CHUNK.replace(b"\n", b"\r\n")
    out, stats = await collect(CHUNK[:10], CHUNK[10:] + crlf[:5], crlf[5:], b"data: [DONE]", include_usage=True)
    assert b"".join(out[:-1]) == CHUNK + CHUNK and out[-1] == DONE_FRAME
    assert stats.completed and stats.chunks == 2


async def test_usage_frame_is_counted_and_dropped_unless_asked_for() -> None:
    out, stats = await collect(CHUNK + USAGE + DONE_FRAME, include_usage=False)
    assert out == [CHUNK, DONE_FRAME]
    assert (stats.prompt_tokens, stats.completion_tokens) == (3, 1)
    out, _ = await collect(CHUNK, USAGE, DONE_FRAME)
    assert out == [CHUNK, USAGE, DONE_FRAME]


async def test_worker_that_ends_early_or_breaks_gives_an_error_frame_then_done() -> None:
    out, stats = await collect(CHUNK)
    assert out[0] == CHUNK and out[-1] == DONE_FRAME and not stats.completed
    assert json.loads(out[-2][6:])["error"]["code"] == "worker_unavailable"
    out, _ = await collect(CHUNK, httpx.RemoteProtocolError("peer closed connection"))
    assert out[-1] == DONE_FRAME and json.loads(out[-2][6:])["error"]["code"] == "worker_unavailable"


async def test_client_that_leaves_cancels_the_upstream_read_at_once() -> None:
    upstream = Upstream(CHUNK, 30.0, CHUNK, DONE_FRAME)
    sent = await asyncio.wait_for(serve(upstream, receive_disconnect_after=0.1), timeout=5)
    assert upstream.closed.is_set()
    assert sent[0] == CHUNK and DONE_FRAME not in sent


async def test_a_cancelled_response_task_is_not_taken_for_a_client_that_left() -> None:
    """The server stopping cancels the response's task: `RelayResponse` re-raises it (only its own disconnect
    watcher's cancel ends the call normally), and the upstream is let go all the same."""
    upstream = Upstream(CHUNK, 30.0, CHUNK, DONE_FRAME)
    task = asyncio.ensure_future(serve(upstream))
    await asyncio.sleep(0.1)
    task.cancel()
    try:
        await asyncio.wait_for(task, timeout=5)
    except asyncio.CancelledError:
        pass
    else:
        raise AssertionError("the cancellation was swallowed")
    assert upstream.closed.is_set()


async def test_a_client_that_leaves_at_once_ends_the_call_normally_with_the_session_closed() -> None:
    """A disconnect seen before the first body write: the call returns (no CancelledError escapes to the
    server) and `on_close` ran (`serve` checks it)."""
    upstream = Upstream(0.5, CHUNK, DONE_FRAME)
    await asyncio.wait_for(serve(upstream, receive_disconnect_after=0.0), timeout=5)
    assert upstream.closed.is_set()
