"""The chat pass-through relay in one task: the body's task reads the upstream and yields what the client gets.

The bytes are relayed as they came (a read that ends on a frame boundary is not re-framed); only the runs that
carry a usage, finish, error, comment or `[DONE]` frame are split (`gateway.serving.relay._relay_run`).
Keep-alives while the upstream is silent come from a timer and go out beside the body (`ClientLine`), so no
second task reads ahead: one task step per upstream read, as in the floor (`bench/relay_floor.py`). The
translated APIs, which need their keep-alives in their own event stream, use `relay_stream` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import httpx

from gateway.errors import Envelope
from gateway.serving.relay import (
    _END_GRACE_S,
    DONE_FRAME,
    ClientLine,
    StreamStats,
    _frames_end,
    _relay_run,
    ended_early,
    stream_errors,
)


class _Quiet:
    """The keep-alive timer: while the relay waits on the upstream (`since` set), a keep-alive every
    `interval` of silence; one timer per interval, not per read."""

    def __init__(self, line: ClientLine, interval: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._line = line
        self._interval = interval
        self.since: float | None = None  # when the pending upstream read began (None: not reading)
        self._timer = self._loop.call_at(self._loop.time() + interval, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        due = now + self._interval
        if self.since is not None:
            if now - self.since >= self._interval:
                self._line.keepalive()
                self.since = now
            else:
                due = self.since + self._interval
        self._timer = self._loop.call_at(due, self._tick)

    def cancel(self) -> None:
        self._timer.cancel()


async def _drain(reads: AsyncIterator[bytes]) -> None:
    """After `[DONE]`: read to the body's end for a moment, which lets httpx keep the upstream connection for
    the next request (a stream cut short closes it)."""
    try:
        async with asyncio.timeout(_END_GRACE_S):
            async for _ in reads:
                pass
    except (TimeoutError, httpx.HTTPError, OSError):
        pass


async def relay_direct(
    response: httpx.Response,
    stats: StreamStats,
    line: ClientLine,
    *,
    model: str,
    include_usage: bool,
    keepalive_s: float,
    on_done: Callable[[], Awaitable[None]],
    cached_tokens: bool = True,
) -> AsyncGenerator[bytes, None]:
    """Relay an upstream SSE body to the client in the caller's task; `on_done` (idempotent) runs before `[DONE]`
    is yielded (the caller releases the slot there) and at the end, however it ends. As `relay_stream`: `[DONE]`
    on its own, and a body that ends early or breaks gives one error frame and `[DONE]`."""
    reads = response.aiter_raw()
    quiet = _Quiet(line, keepalive_s)
    buffer = b""
    try:
        with stream_errors(stats, model):
            while True:
                if quiet.since is None:  # silence counts from the client's last write, not the last read: the
                    quiet.since = time.monotonic()  # worker's comments while it prefills reach no client
                try:
                    chunk = await anext(reads)
                except StopAsyncIteration:
                    if not buffer.strip():
                        break
                    chunk = b"\n\n"  # the body ended inside a frame: end the frame, relay it, then end
                if line.held:
                    quiet.since = None
                    yield line.held
                    line.held = b""
                if not buffer and chunk[-2:] == b"\n\n" and b"\r" not in chunk and b"\n\n\n" not in chunk:
                    run = chunk  # the common case: a read of whole frames
                else:
                    buffer += chunk.replace(b"\r\n", b"\n")
                    end = _frames_end(buffer)
                    if not end:
                        continue
                    run, buffer = buffer[:end], buffer[end:]
                out, done = _relay_run(run, stats, include_usage, cached_tokens)
                if line.chunk is not None:
                    line.chunk.adopt(run)
                quiet.since = None if out or done else quiet.since
                if out:
                    yield out
                if done:
                    stats.completed = True
                    await _drain(reads)
                    await on_done()
                    yield DONE_FRAME
                    return
            stats.error = ended_early(model)
    finally:
        quiet.cancel()
        if stats.error is None or stats.completed:
            await on_done()  # the client went away, or the stream completed (done again: a no-op)
    yield Envelope.OPENAI.sse(stats.error)
    await on_done()
    yield DONE_FRAME


_REASONING_KEY = b'"reasoning_content":'


async def renamed_reasoning(frames: AsyncGenerator[bytes, None]) -> AsyncGenerator[bytes, None]:
    """The runs with each delta's `reasoning_content` key named `reasoning` (vLLM's and Ollama's name). The
    key with its closing quote and colon never occurs inside a JSON string (a quote there is escaped), so a
    byte replacement renames keys only."""
    async with contextlib.aclosing(frames):
        async for run in frames:
            yield run.replace(_REASONING_KEY, b'"reasoning":') if _REASONING_KEY in run else run
