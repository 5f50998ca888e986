"""The HTTP relay to workers: SSE framing, keep-alives, disconnect → close upstream, errors mid-stream.

Frames are relayed byte-for-byte; only the usage frame is inspected (the gateway always asks the engine
for usage, for exact token metrics, and drops that frame when the client did not ask for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.errors import STATUS, Envelope, ErrorCode, GatewayError, internal_error
from gateway.serving.upstream import transport_error

DONE_FRAME = b"data: [DONE]\n\n"
KEEPALIVE_FRAME = b": keep-alive\n\n"
_READ_AHEAD = 32  # upstream reads buffered before the reader waits for the client (back-pressure)
_END_GRACE_S = 0.05  # how long `[DONE]` waits for the upstream body to end, so its connection is reused
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass
class StreamStats:
    """What a relayed stream did, for metrics and the access log."""

    started: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None  # the first chunk relayed (a chat stream's role-only chunk, say)
    first_content_at: float | None = None  # the first chunk carrying generated tokens
    last_chunk_at: float | None = None
    inter_chunk_s: list[float] = field(default_factory=list)
    chunks: int = 0
    chunks_before_content: int = 0  # of `chunks`, those relayed before the first content (role chunks)
    prompt_tokens: int | None = None
    cached_tokens: int | None = None  # of the prompt, served from the engine's prefix cache (None: it does not say)
    completion_tokens: int | None = None
    error: GatewayError | None = None
    completed: bool = False

    @property
    def content_chunks(self) -> int:
        """Chunks relayed from the first content on: the generated tokens of a stream cut short before its
        usage frame (the llama.cpp worker and LMDeploy stream one token a chunk; a character spread over
        several tokens, or a tool call, arrives in fewer chunks, so this can undercount, never overcount by
        more than the finish chunk)."""
        return self.chunks - self.chunks_before_content if self.first_content_at is not None else 0


@dataclass(frozen=True)
class StreamFailure:
    """A relayed stream that broke after its headers were sent (its one `data: {"error": ...}` frame), typed for
    the translated APIs: the HTTP status its error would have had, the message and the gateway's code."""

    status: int
    message: str
    code: str

    @classmethod
    def from_frame(cls, data: bytes) -> StreamFailure:
        """Read an error frame's JSON (`{"error": {"message", "type", "param", "code"}}`)."""
        try:
            error = json.loads(data).get("error")
        except (ValueError, AttributeError):
            error = None
        if not isinstance(error, dict):
            return cls(502, "the generation failed", ErrorCode.UPSTREAM_ERROR.value)
        code = str(error.get("code") or ErrorCode.UPSTREAM_ERROR.value)
        try:
            status = STATUS[ErrorCode(code)]
        except ValueError:
            status = 502
        return cls(status, str(error.get("message") or "the generation failed"), code)


class KeepaliveChunk:
    """A chat or text-completion stream's keep-alive that OpenAI-SDK clients see: a chunk with `choices: []`
    (valid against OpenAI's chunk schema, like the usage chunk and Azure OpenAI's prompt-filter chunk, which
    clients already skip), where an SSE comment is dropped by every SDK's parser before an idle watchdog such
    as Qwen Code's sees it. It takes the stream's own id, `created` and `model` from its first upstream chunk
    (`adopt`); before that, the gateway's."""

    def __init__(self, *, object_name: str, id_: str, model: str) -> None:
        self._head: dict[str, Any] = {"id": id_, "object": object_name, "created": int(time.time()), "model": model}
        self._adopted = False

    def adopt(self, run: bytes) -> None:
        """Take id, created and model from the first `data:` chunk in `run` (once; cheap after that)."""
        if self._adopted or not run.startswith(b"data: {"):
            return
        try:
            first = json.loads(run[6 : run.index(b"\n\n")])
        except ValueError:
            return
        if isinstance(first, dict) and isinstance(first.get("id"), str):
            self._adopted = True
            self._head.update({k: first[k] for k in ("id", "created", "model") if k in first})

    def frame(self) -> bytes:
        return b"data: " + json.dumps({**self._head, "choices": []}, separators=(",", ":")).encode() + b"\n\n"


class ClientLine:
    """The client's connection beside the body: a keep-alive comment written between two of the body's writes,
    while the body's own task waits on the upstream (the one-task relay, `relay_direct`).

    `RelayResponse` attaches its ASGI `send`; until then (a caller iterating the body itself) a keep-alive is
    held and handed to the body, which yields it before its next run. A keep-alive that fails to send makes the
    body's next write fail; the disconnect itself is seen by `RelayResponse`'s receive watcher, which cancels the
    body's task (and with it the upstream read: the worker aborts the generation).
    """

    def __init__(self, chunk: KeepaliveChunk | None = None) -> None:
        self._send: Send | None = None
        self._aside: asyncio.Task[None] | None = None
        self._failed = False
        self.held = b""
        self.chunk = chunk  # None: keep-alives are SSE comments

    def attach(self, send: Send) -> None:
        self._send = send

    @property
    def frame(self) -> bytes:
        """What a keep-alive writes: the stream's empty chunk (`KeepaliveChunk`), or an SSE comment."""
        return KEEPALIVE_FRAME if self.chunk is None else self.chunk.frame()

    def keepalive(self) -> None:
        """From the relay's timer, while the body's task waits on the upstream (no body write in flight)."""
        if self._send is None:
            self.held = self.frame
        elif self._aside is None or self._aside.done():
            self._aside = asyncio.get_running_loop().create_task(self._write(self._send, self.frame))

    async def _write(self, send: Send, frame: bytes) -> None:
        try:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        except Exception:
            self._failed = True

    async def settle(self) -> None:
        """Before a body write: wait for a keep-alive in flight; raise if one failed."""
        if self._aside is not None:
            if not self._aside.done():
                await self._aside
            self._aside = None
        if self._failed:
            raise OSError("the client connection failed")


class RelayResponse(StreamingResponse):
    """A StreamingResponse that always runs `on_close`, even if the body iterator never started; with a
    `line`, keep-alives are written beside the body (`ClientLine`)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        on_close: Callable[[], Awaitable[None]],
        *,
        line: ClientLine | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(content, media_type="text/event-stream", **kwargs)
        self._on_close = on_close
        self._line = line

    async def stream_response(self, send: Send) -> None:
        line = self._line
        if line is None:
            await super().stream_response(send)
            return
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        line.attach(send)
        async for chunk in self.body_iterator:
            await line.settle()
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await line.settle()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the body in this task while a watcher task waits for the client's `http.disconnect` and then
        cancels it (the upstream read with it: the worker aborts the generation); a disconnect ends the call
        normally. Starlette's own `__call__` does the same for ASGI servers before spec 2.4 (uvicorn's) with an
        anyio task group and a second task for the body, on the path to every stream's first token."""
        task = asyncio.current_task()
        assert task is not None and scope["type"] == "http"
        streaming, gone = True, False

        async def watch() -> None:
            nonlocal gone
            try:
                while (await receive())["type"] != "http.disconnect":
                    pass
            except Exception:  # a receive that fails says nothing of the client
                return
            if streaming:
                gone = True
                task.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone or task.uncancel() > 0:
                raise  # not (only) the client's disconnect: the server is stopping
        finally:
            streaming = False
            watcher.cancel()
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()  # type: ignore[attr-defined]
            await self._on_close()


def _inspect_frame(frame: bytes, stats: StreamStats, cached_tokens: bool = True) -> tuple[bool, bytes]:
    """Update stats from one `data:` frame: whether it is the usage-only frame (choices == []), and the frame
    to relay. With `cached_tokens` False (an engine whose count is not measured: LMDeploy with --disable-metrics)
    the usage's `prompt_tokens_details` is taken out of the frame and not read."""
    if b'"usage"' not in frame or frame.startswith(b"data: [DONE]"):
        return False, frame
    try:
        data = json.loads(frame[5:])
    except ValueError:
        return False, frame
    if not isinstance(data, dict):
        return False, frame
    usage = data.get("usage")
    if isinstance(usage, dict):
        stats.prompt_tokens = usage.get("prompt_tokens")
        if not cached_tokens and usage.pop("prompt_tokens_details", None) is not None:
            frame = b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
        details = usage.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        stats.cached_tokens = cached if isinstance(cached, int) else None
        if data.get("choices") == [] or usage.get("completion_tokens"):  # not a first chunk's prompt usage
            stats.completion_tokens = usage.get("completion_tokens")
    return usage is not None and data.get("choices") == [], frame


async def sse_frames(response: httpx.Response) -> AsyncIterator[bytes]:
    """Split an upstream SSE body into runs of complete frames (each frame ending in a blank line), one run
    per upstream read: the relay then writes to its client once per read, however many frames it held."""
    buffer = b""
    async for chunk in response.aiter_raw():
        buffer += chunk.replace(b"\r\n", b"\n")
        end = _frames_end(buffer)
        if end:
            yield buffer[:end]
            buffer = buffer[end:]
    if buffer.strip():
        yield buffer + b"\n\n"


def _frames_end(buffer: bytes) -> int:
    """Where the last complete frame in `buffer` ends (0: none yet), splitting at blank lines left to right."""
    if b"\n\n\n" in buffer:  # a run of newlines: split as frame-by-frame parsing would
        return len(buffer) - len(buffer.split(b"\n\n")[-1])
    return buffer.rfind(b"\n\n") + 2 if b"\n\n" in buffer else 0


def _relay_run(run: bytes, stats: StreamStats, include_usage: bool, cached_tokens: bool = True) -> tuple[bytes, bool]:
    """What to send the client for a run of complete frames, and whether the run reached `[DONE]` (which is
    not included, nor anything after it). Comments are dropped, the usage-only frame too unless asked for;
    `cached_tokens` False: usage details left out (`_inspect_frame`)."""
    now = time.monotonic()
    if stats.first_content_at is None and _carries_content(run):
        stats.first_content_at = now
        stats.chunks_before_content = stats.chunks
    if not (
        run.startswith(b":") or b"\n\n:" in run or b'"usage"' in run or b'"finish_reason":"' in run
        or b'"finish_reason": "' in run
        or b"[DONE]" in run or b'data: {"error"' in run or b"event: error" in run
    ):  # fmt: skip
        _count_chunks(stats, run.count(b"\n\n"), now)  # plain content frames: relayed as they are
        return run, False
    kept: list[bytes] = []
    for part in run.split(b"\n\n")[:-1]:
        frame = part + b"\n\n"
        if frame.startswith(b":"):
            continue  # upstream comments are not relayed; we send our own keep-alives
        if frame.startswith(DONE_FRAME[:12]):
            return b"".join(kept), True
        if frame.startswith(b'data: {"error"') or frame.startswith(b"event: error"):
            stats.error = GatewayError(ErrorCode.UPSTREAM_ERROR, frame.decode(errors="replace")[:300])
            kept.append(frame)
            continue
        usage_only, frame = _inspect_frame(frame, stats, cached_tokens)
        if usage_only and not include_usage:
            continue
        _count_chunks(stats, 1, now)
        kept.append(frame)
    return b"".join(kept), False


_CONTENT_KEYS = ("content", "tool_calls", "reasoning_content", "refusal")  # a delta's generated parts


def _carries_content(run: bytes) -> bool:
    """Whether a run of frames holds generated tokens: a chat delta with text, tool calls or reasoning, or a
    completion's text. A chat stream's first chunk (role only, content "") holds none: engines send it before
    the prefill. Parsed only until a stream's first content, so a stream pays this once."""
    for part in run.split(b"\n\n"):
        if not part.startswith(b"data:") or part.startswith(b"data: [DONE]"):
            continue
        try:
            data = json.loads(part[5:])
        except ValueError:
            continue
        choices = data.get("choices") if isinstance(data, dict) else None
        for choice in choices if isinstance(choices, list) else ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            if choice.get("text") or (isinstance(delta, dict) and any(delta.get(k) for k in _CONTENT_KEYS)):
                return True
    return False


def _count_chunks(stats: StreamStats, n: int, now: float) -> None:
    """Account `n` content chunks that reached the relay together at `now`."""
    if not n:
        return
    stats.chunks += n
    if stats.first_token_at is None:
        stats.first_token_at = now
    elif stats.last_chunk_at is not None:
        stats.inter_chunk_s.append(now - stats.last_chunk_at)
    if n > 1:
        stats.inter_chunk_s.extend(itertools.repeat(0.0, n - 1))
    stats.last_chunk_at = now


class _ReadAhead:
    """Reads the upstream in one task of its own, ahead of the client.

    `get()` returns every run read since the last call, `[]`
    once the upstream has ended (`failure` says how), or None when the relay has waited `keepalive_s` for
    the upstream: time for a keep-alive comment. The keep-alive timer runs once per interval, not per frame.
    """

    def __init__(self, runs: AsyncIterator[bytes], keepalive_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._runs = runs
        self._keepalive_s = keepalive_s
        self._buffered: list[bytes] = []
        self._ended = False
        self.failure: Exception | None = None
        self._waiter: asyncio.Future[bool] | None = None  # the relay, waiting for the upstream
        self._waiting_since = 0.0
        self._space: asyncio.Future[None] | None = None  # the reader, waiting for the relay (back-pressure)
        self._task = self._loop.create_task(self._read())
        self._timer = self._loop.call_at(self._loop.time() + keepalive_s, self._tick)

    async def _read(self) -> None:
        try:
            async for run in self._runs:
                self._buffered.append(run)
                self._wake(keepalive=False)
                if len(self._buffered) >= _READ_AHEAD:
                    self._space = self._loop.create_future()
                    await self._space
        except Exception as exc:
            self.failure = exc
        finally:
            self._ended = True
            self._wake(keepalive=False)

    def _wake(self, *, keepalive: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(keepalive)

    def _tick(self) -> None:
        now = self._loop.time()
        due = now + self._keepalive_s  # the relay is busy: when it waits again, it sets its own deadline
        if self._waiter is not None and not self._waiter.done():
            if now >= self._waiting_since + self._keepalive_s:
                self._waiter.set_result(True)
            else:
                due = self._waiting_since + self._keepalive_s
        self._timer = self._loop.call_at(due, self._tick)

    async def get(self, *, sent: bool = True) -> list[bytes] | None:
        """`sent`: the relay wrote to its client since the last call, so silence counts from now (a run of
        upstream comments, which reach no client, leaves the count running)."""
        now = self._loop.time()
        if sent:
            self._waiting_since = now
        elif not self._buffered and now >= self._waiting_since + self._keepalive_s:
            return None  # the timer fired while the relay was busy with comments
        if not self._buffered and not self._ended:
            self._waiter = self._loop.create_future()
            try:
                if await self._waiter:
                    return None
            finally:
                self._waiter = None
        runs, self._buffered = self._buffered, []
        if self._space is not None and not self._space.done():
            self._space.set_result(None)
        return runs

    async def finish(self) -> None:
        """After `[DONE]`: give the read in flight a moment to reach the end of the body, which lets httpx
        keep the upstream connection for the next request (a stream cut short closes it); then `close()`."""
        if not self._task.done():
            await asyncio.wait({self._task}, timeout=_END_GRACE_S)
        await self.close()

    async def close(self) -> None:
        """Stop reading; returns once the pending read has unwound, or at once if this task is cancelled.

        The pending read is cancelled exactly once and left to unwind on its own: httpcore closes the
        upstream connection while unwinding (so the worker aborts the generation). Awaiting the task
        directly would forward every further cancellation of this task into it (a client that leaves, then
        the server stopping, cancel it again), interrupt that cleanup and leave the connection open and the worker
        generating for a client that is gone.
        """
        self._timer.cancel()
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.shield(self._task)


def ended_early(model: str) -> GatewayError:
    """A stream whose upstream body ended without `[DONE]`."""
    return GatewayError(
        ErrorCode.WORKER_UNAVAILABLE, f"model {model!r}: the worker ended the stream early (it may have crashed)"
    )


@contextlib.contextmanager
def stream_errors(stats: StreamStats, model: str) -> Iterator[None]:
    """Around a relay's loop (both relays): a broken upstream connection becomes `stats.error`, a bug becomes
    an internal error on the client's stream and is raised on; whatever the caller does at the end follows."""
    try:
        yield
    except (httpx.HTTPError, OSError) as exc:
        stats.error = transport_error(exc, model)
    except Exception:
        stats.error = internal_error()
        raise


async def relay_stream(
    frames: AsyncIterator[bytes],
    stats: StreamStats,
    *,
    model: str,
    include_usage: bool,
    keepalive_s: float,
    cached_tokens: bool = True,
) -> AsyncGenerator[bytes, None]:
    """Relay upstream frames to the client, with keep-alive comments while the upstream is silent.

    `frames` yields runs of one or more complete frames (as `sse_frames` does, one run per upstream read);
    each run becomes one client write. `[DONE]` is always yielded on its own.
    If the upstream ends without `[DONE]` or its connection breaks, the client gets one error frame and
    `[DONE]`: a stream always ends, never hangs.
    """
    reader = _ReadAhead(frames, keepalive_s)
    sent = True
    try:
        with stream_errors(stats, model):
            while True:
                runs = await reader.get(sent=sent)
                sent = runs is None
                if runs is None:
                    yield KEEPALIVE_FRAME
                    continue
                if not runs:
                    break
                for run in runs:
                    out, done = _relay_run(run, stats, include_usage, cached_tokens)
                    if out:
                        sent = True
                        yield out
                    if done:
                        stats.completed = True
                        await reader.finish()  # before `[DONE]`: the caller closes the upstream response on it
                        yield DONE_FRAME
                        return
            if reader.failure is not None:
                raise reader.failure
            stats.error = ended_early(model)
    finally:
        await reader.close()
    if stats.error is not None:
        yield Envelope.OPENAI.sse(stats.error)
        yield DONE_FRAME
