"""The HTTP relay to workers: SSE framing, keep-alives, disconnect → close upstream, errors mid-stream.

Frames are relayed byte-for-byte; only the usage frame is inspected (the gateway always asks the engine
for usage, for exact token metrics, and drops that frame when the client did not ask for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from backends.base import UpstreamError
from gateway.errors import ErrorCode, GatewayError, internal_error, sse_error_frame

DONE_FRAME = b"data: [DONE]\n\n"
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class StreamStats:
    """What a relayed stream did, for metrics and the access log."""

    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    last_chunk_at: float | None = None
    inter_chunk_s: list[float] = field(default_factory=list)
    chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: GatewayError | None = None
    client_gone: bool = False
    completed: bool = False


def upstream_error_to_gateway(err: UpstreamError) -> GatewayError:
    """Map a worker's error to the gateway's family (one table for every engine)."""
    if err.code == "context_length_exceeded":
        return GatewayError(ErrorCode.CONTEXT_LENGTH_EXCEEDED, err.message, param=err.param or "messages")
    if err.status == 400 or err.status == 422:
        return GatewayError(ErrorCode.INVALID_REQUEST, err.message, param=err.param)
    if err.status == 429:
        return GatewayError(ErrorCode.QUEUE_FULL, err.message, retry_after_s=5)
    if err.status == 503:
        return GatewayError(ErrorCode.WORKER_UNAVAILABLE, err.message, retry_after_s=5)
    return GatewayError(ErrorCode.UPSTREAM_ERROR, f"worker error ({err.status}): {err.message}")


def transport_error(exc: Exception, model: str) -> GatewayError:
    if isinstance(exc, httpx.TimeoutException):
        return GatewayError(ErrorCode.UPSTREAM_TIMEOUT, f"model {model!r} did not answer in time", retry_after_s=5)
    return GatewayError(
        ErrorCode.WORKER_UNAVAILABLE,
        f"model {model!r}: worker connection lost ({type(exc).__name__}); it is being restarted",
        retry_after_s=5,
    )


class RelayResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close`, even if the body iterator never started."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs: Any) -> None:
        super().__init__(content, media_type="text/event-stream", **kwargs)
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._on_close()


def _inspect_frame(frame: bytes, stats: StreamStats) -> bool:
    """Update stats from one `data:` frame; True if it is the usage-only frame (choices == [])."""
    if b'"usage"' not in frame or frame.startswith(b"data: [DONE]"):
        if b'"finish_reason":"' in frame or b'"finish_reason": "' in frame:
            with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
                data = json.loads(frame[5:])
                stats.finish_reason = data["choices"][0]["finish_reason"] or stats.finish_reason
        return False
    try:
        data = json.loads(frame[5:])
    except ValueError:
        return False
    if not isinstance(data, dict):
        return False
    usage = data.get("usage")
    if isinstance(usage, dict):
        stats.prompt_tokens = usage.get("prompt_tokens")
        stats.completion_tokens = usage.get("completion_tokens")
    choices = data.get("choices")
    if choices:
        reason = choices[0].get("finish_reason")
        if reason:
            stats.finish_reason = reason
    return usage is not None and choices == []


async def sse_frames(response: httpx.Response) -> AsyncIterator[bytes]:
    """Split an upstream SSE body into complete frames (each ending in a blank line)."""
    buffer = b""
    async for chunk in response.aiter_raw():
        buffer += chunk.replace(b"\r\n", b"\n")
        while True:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            frame, buffer = buffer[: end + 2], buffer[end + 2 :]
            yield frame
    if buffer.strip():
        yield buffer + b"\n\n"


async def relay_stream(
    frames: AsyncIterator[bytes],
    stats: StreamStats,
    *,
    model: str,
    include_usage: bool,
    keepalive_s: float,
) -> AsyncGenerator[bytes, None]:
    """Relay upstream frames to the client, with keep-alive comments while the upstream is silent.

    If the upstream ends without `[DONE]` or its connection breaks, the client gets one error frame and
    `[DONE]`: a stream always ends, never hangs.
    """
    iterator = frames.__aiter__()
    next_frame: asyncio.Task[bytes] | None = None
    try:
        while True:
            if next_frame is None:
                next_frame = asyncio.ensure_future(iterator.__anext__())
            done, _ = await asyncio.wait({next_frame}, timeout=keepalive_s)
            if not done:
                yield b": keep-alive\n\n"
                continue
            task, next_frame = next_frame, None
            try:
                frame = task.result()
            except StopAsyncIteration:
                break
            if frame.startswith(b":"):
                continue  # upstream comments are not relayed; we send our own keep-alives
            if frame.startswith(DONE_FRAME[:12]):
                stats.completed = True
                yield DONE_FRAME
                return
            if frame.startswith(b'data: {"error"') or frame.startswith(b"event: error"):
                stats.error = GatewayError(ErrorCode.UPSTREAM_ERROR, frame.decode(errors="replace")[:300])
                yield frame
                continue
            now = time.monotonic()
            if _inspect_frame(frame, stats) and not include_usage:
                continue
            stats.chunks += 1
            if stats.first_token_at is None:
                stats.first_token_at = now
            elif stats.last_chunk_at is not None:
                stats.inter_chunk_s.append(now - stats.last_chunk_at)
            stats.last_chunk_at = now
            yield frame
        stats.error = GatewayError(
            ErrorCode.WORKER_UNAVAILABLE,
            f"model {model!r}: the worker ended the stream early (it may have crashed)",
        )
    except (httpx.HTTPError, OSError) as exc:
        stats.error = transport_error(exc, model)
    except Exception:
        stats.error = internal_error()
        raise
    finally:
        if next_frame is not None:
            # Cancel the pending read exactly once and let it unwind on its own: httpcore closes the
            # upstream connection while unwinding (so the worker aborts the generation). Awaiting the
            # task directly would forward every further cancellation of this task into it (Starlette
            # re-cancels a disconnected response's task), interrupt that cleanup and leave the
            # connection open and the worker generating for a client that is gone.
            next_frame.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(next_frame)
    if stats.error is not None:
        yield sse_error_frame(stats.error)
        yield DONE_FRAME
