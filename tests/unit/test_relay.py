"""The SSE relay on its own: keep-alives while the worker is silent, streams that always end, and a
client that leaves never interrupting the upstream connection's cleanup (no sockets: frames are fakes)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.serving.relay import DONE_FRAME, StreamStats, _carries_content, relay_stream, sse_frames

CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}\n\n'
ROLE = b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'


async def frames(*items: bytes | float | Exception) -> AsyncIterator[bytes]:
    """A fake upstream: yields frames, sleeps for floats, raises exceptions."""
    for item in items:
        if isinstance(item, float):
            await asyncio.sleep(item)
        elif isinstance(item, Exception):
            raise item
        else:
            yield item


async def relay(source: AsyncIterator[bytes], *, include_usage: bool = True, keepalive_s: float = 10) -> list[bytes]:
    stats = StreamStats()
    return [
        f async for f in relay_stream(source, stats, model="m", include_usage=include_usage, keepalive_s=keepalive_s)
    ]


async def test_silent_worker_gets_keepalive_comments() -> None:
    out = await relay(frames(0.25, CHUNK, DONE_FRAME), keepalive_s=0.05)
    assert out[-2:] == [CHUNK, DONE_FRAME]
    assert len([f for f in out if f == b": keep-alive\n\n"]) >= 2


async def test_usage_frame_is_dropped_unless_asked_for() -> None:
    assert await relay(frames(CHUNK, USAGE, DONE_FRAME), include_usage=False) == [CHUNK, DONE_FRAME]
    assert await relay(frames(CHUNK, USAGE, DONE_FRAME), include_usage=True) == [CHUNK, USAGE, DONE_FRAME]


async def test_worker_that_ends_without_done_gives_an_error_frame_then_done() -> None:
    out = await relay(frames(CHUNK))
    assert out[0] == CHUNK and out[-1] == DONE_FRAME
    error = json.loads(out[-2][6:])["error"]
    assert error["code"] == "worker_unavailable" and error["type"] == "server_error"


async def test_broken_connection_gives_an_error_frame_then_done() -> None:
    out = await relay(frames(CHUNK, httpx.RemoteProtocolError("peer closed connection")))
    assert out[-1] == DONE_FRAME
    assert json.loads(out[-2][6:])["error"]["code"] == "worker_unavailable"


async def test_client_leaving_does_not_interrupt_the_upstream_cleanup() -> None:
    """Starlette cancels a disconnected response's task again and again until it ends; none of those
    cancellations may reach the pending upstream read, whose cleanup closes the worker connection (that
    is what makes the worker abort the generation)."""
    cleaned = asyncio.Event()

    async def upstream() -> AsyncIterator[bytes]:
        try:
            yield CHUNK
            await asyncio.sleep(3600)  # the worker is busy with a long prefill
        finally:
            await asyncio.sleep(0.05)  # closing the connection takes a few loop turns
            cleaned.set()

    async def client() -> None:
        async for _ in relay_stream(upstream(), StreamStats(), model="m", include_usage=True, keepalive_s=10):
            pass

    task = asyncio.create_task(client())
    await asyncio.sleep(0.02)
    for _ in range(30):  # level-triggered cancellation, as anyio delivers it
        task.cancel()
        await asyncio.sleep(0.005)
    await asyncio.wait_for(cleaned.wait(), 2)


async def test_frames_are_relayed_in_runs_one_per_upstream_read() -> None:
    """Each upstream read becomes one run of complete frames; a partial frame waits for the next read."""

    async def body() -> AsyncIterator[bytes]:
        for part in (CHUNK + CHUNK[:20], CHUNK[20:] + b"\n" + CHUNK, b": ping\r\n\r\n" + USAGE, DONE_FRAME):
            yield part

    runs = [run async for run in sse_frames(httpx.Response(200, content=body()))]
    assert runs == [CHUNK, CHUNK + b"\n" + CHUNK, b": ping\n\n" + USAGE, DONE_FRAME]
    stats = StreamStats()
    out = [f async for f in relay_stream(iter_async(runs), stats, model="m", include_usage=False, keepalive_s=10)]
    assert b"".join(out) == CHUNK * 2 + b"\n" + CHUNK + DONE_FRAME
    assert stats.chunks == 3 and stats.completed and stats.prompt_tokens == 3 and len(stats.inter_chunk_s) == 2


async def iter_async(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


async def test_the_first_generated_token_is_told_from_a_role_only_first_chunk() -> None:
    """Engines send a chat stream's role chunk before the prefill: TTFT and decode speed start at content."""
    stats = StreamStats()
    source = frames(ROLE, 0.05, CHUNK, CHUNK, DONE_FRAME)
    out = [f async for f in relay_stream(source, stats, model="m", include_usage=True, keepalive_s=10)]
    assert out[-1] == DONE_FRAME
    assert stats.first_token_at is not None and stats.first_content_at is not None
    assert stats.first_content_at - stats.first_token_at >= 0.04
    silent = StreamStats()
    _ = [f async for f in relay_stream(frames(ROLE, USAGE, DONE_FRAME), silent, model="m", include_usage=True,
                                       keepalive_s=10)]  # fmt: skip
    assert silent.first_token_at is not None and silent.first_content_at is None


@pytest.mark.parametrize(
    ("frame", "content"),
    [
        (CHUNK, True),
        (ROLE, False),
        (USAGE, False),
        (DONE_FRAME, False),
        (b": keep-alive\n\n", False),
        (b'data: {"error": {"message": "boom"}}\n\n', False),
        (b'data: {"choices":[{"index":0,"text":"Once","finish_reason":null}]}\n\n', True),
        (b'data: {"choices":[{"index":0,"text":"","finish_reason":"stop"}]}\n\n', False),
        (b'data: {"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c"}]}}]}\n\n', True),
        (b'data: {"choices":[{"index":0,"delta":{"reasoning_content":"hm"}}]}\n\n', True),
        (ROLE + b"data: not json\n\n" + CHUNK, True),
    ],
)
def test_content_is_text_tool_calls_or_reasoning_in_some_choice(frame: bytes, content: bool) -> None:
    assert _carries_content(frame) is content


async def test_the_usage_frame_tells_how_much_of_the_prompt_came_from_the_prefix_cache() -> None:
    usage = (
        b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10,'
        b'"prompt_tokens_details":{"cached_tokens":6}}}\n\n'
    )
    stats = StreamStats()
    _ = [f async for f in relay_stream(frames(CHUNK, usage, DONE_FRAME), stats, model="m", include_usage=False,
                                       keepalive_s=10)]  # fmt: skip
    assert (stats.prompt_tokens, stats.cached_tokens) == (9, 6)
    bare = StreamStats()
    _ = [f async for f in relay_stream(frames(CHUNK, USAGE, DONE_FRAME), bare, model="m", include_usage=False,
                                       keepalive_s=10)]  # fmt: skip
    assert bare.cached_tokens is None  # an engine that does not say: not known (never a measured 0)


async def test_a_first_chunks_prompt_usage_counts_the_prompt_but_no_completion_tokens() -> None:
    """`include_prompt_usage` (Messages streams): the first chunk's usage gives the prompt's counts; a stream cut
    after it still counts its content chunks as generated tokens, as one without any usage would."""
    first = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],'
        b'"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9,"prompt_tokens_details":{"cached_tokens":6}}}\n\n'
    )
    stats = StreamStats()
    out = [f async for f in relay_stream(frames(first, CHUNK, CHUNK), stats, model="m", include_usage=False,
                                         keepalive_s=10)]  # fmt: skip
    assert out[0] == first  # relayed: it is a chunk with a choice, not the usage-only frame
    assert (stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (9, 6, None)
    _ = [f async for f in relay_stream(frames(first, CHUNK, USAGE, DONE_FRAME), stats, model="m", include_usage=False,
                                       keepalive_s=10)]  # fmt: skip
    assert (stats.prompt_tokens, stats.completion_tokens) == (3, 1)  # the final usage-only frame wins
