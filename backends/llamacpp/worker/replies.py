"""A request's reply, streamed (SSE chunks, choices interleaved by index) or whole (one JSON body)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from starlette.responses import JSONResponse, Response
from starlette.types import Receive

from backends.llamacpp.worker.choices import (
    Choice,
    cancel_all,
    chat_logprobs,
    completion_logprobs,
    events,
    failure,
    message,
    on_text,
    reasoning_tokens,
    total_usage,
)
from backends.llamacpp.worker.httpkit import client_closed, watch_disconnect
from backends.llamacpp.worker.tickets import Failed, Started, TextDelta, Usage
from backends.llamacpp.worker.wire import SSE_DONE, Renderer, sse, usage_body

_T = TypeVar("_T")


PREFILL_HEARTBEAT_S = 0.5
"""How often a stream that has no token yet says so (`PREFILL_FRAME`): the gateway reads it as a sign of life,
so a long prefill is not silence against its `upstream_timeout_s` (it drops the comment)."""
PREFILL_FRAME = b": prefilling\n\n"


async def stream(
    choices: Sequence[Choice], render: Renderer, include_usage: bool, prompt_usage: bool = False
) -> AsyncIterator[bytes]:
    """SSE frames: each choice's role delta, its content/tool-call deltas, its finish; then usage, [DONE].

    With `prompt_usage` (`stream_options.include_prompt_usage`) the opening waits until the prompt has its
    slot (the first choice's `Started`) and its first chunk carries the prompt's usage; otherwise the opening
    goes out at once, without usage. Until the first event after that, a `PREFILL_FRAME` comment goes out
    every `PREFILL_HEARTBEAT_S` (the prompt waits for its slot or is prefilled)."""
    chat = render.kind == "chat"
    opened = not prompt_usage
    if opened:
        for frame in _opening(choices, render, None):
            yield frame
    offsets = [0] * len(choices)
    async for item in _with_heartbeats(events(choices), PREFILL_HEARTBEAT_S):
        if item is None:
            yield PREFILL_FRAME
            continue
        choice, event = item
        if not opened and not isinstance(event, Failed):
            opened = True
            for frame in _opening(choices, render, event.usage if isinstance(event, Started) else None):
                yield frame
        if isinstance(event, Started):
            continue
        if isinstance(event, TextDelta):
            if chat:
                for delta in on_text(choice, event):
                    yield sse(render.chunk(delta, index=choice.index, logprobs=_chat_lp(choice)))
            elif event.text or event.logprobs:
                lp = completion_logprobs(event.logprobs, offsets[choice.index]) if choice.logprobs else None
                offsets[choice.index] += len(event.text)
                yield sse(render.text_chunk(event.text, index=choice.index, logprobs=lp))
        elif isinstance(event, Failed):
            cancel_all(choices)
            yield sse(failure(event).body())
            yield SSE_DONE
            return
        else:
            if event.reason == "cancelled" and not choice.output.done:
                cancel_all(choices)
                return  # the client went away
            choice.finished = event
            for frame in _finish_frames(choice, render):
                yield frame
    if include_usage:
        yield sse(render.usage_chunk(total_usage(choices), reasoning_tokens(choices)))
    yield SSE_DONE


async def _with_heartbeats(items: AsyncIterator[_T], interval_s: float) -> AsyncIterator[_T | None]:
    """`items`, with a None after each `interval_s` without one until the first item that is not a `Started`
    (the first token, or the end); from then on `items` as they are, with no task per item."""
    iterator = aiter(items)
    pending: asyncio.Future[_T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            try:
                item = pending.result()
            except StopAsyncIteration:
                return
            pending = None
            yield item
            if not isinstance(item, tuple) or not isinstance(item[1], Started):
                break
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
    async for item in iterator:
        yield item


def _opening(choices: Sequence[Choice], render: Renderer, usage: Usage | None) -> list[bytes]:
    """A chat stream's role delta per choice (a completion stream has none); the first carries `usage` when
    given (a completion stream then opens with an empty text chunk for it)."""
    if render.kind == "chat":
        bodies = [render.chunk({"role": "assistant", "content": ""}, index=c.index) for c in choices]
    else:
        bodies = [render.text_chunk("")] if usage is not None else []
    if usage is not None:
        bodies[0]["usage"] = usage_body(usage)
    return [sse(body) for body in bodies]


def _chat_lp(choice: Choice) -> dict[str, Any] | None:
    return chat_logprobs(choice.take_logprobs()) if choice.logprobs else None


def _finish_frames(choice: Choice, render: Renderer) -> list[bytes]:
    """A choice's finishing frames: what its output held back, then its `finish_reason` (and `stop_reason`).

    The reasons are read only after `output.finish()`: the held-back text may complete the reply's calls
    (`ChatOutput.done`), which makes the finish "tool_calls"."""
    if render.kind != "chat":
        chunk = render.text_chunk("", choice.finish_reason(), index=choice.index, stop_reason=choice.stop_reason())
        return [sse(chunk)]
    frames = [sse(render.chunk(d, index=choice.index, logprobs=_chat_lp(choice))) for d in choice.output.finish()]
    lp = _chat_lp(choice) if choice.pending else None
    finish, matched = choice.finish_reason(), choice.stop_reason()
    frames.append(sse(render.chunk({}, finish, index=choice.index, logprobs=lp, stop_reason=matched)))
    return frames


async def collect(choices: Sequence[Choice], render: Renderer, receive: Receive) -> Response:
    """The whole reply as one body; a client that goes away cancels every choice."""
    texts: list[list[str]] = [[] for _ in choices]
    try:
        async with watch_disconnect(receive, lambda: cancel_all(choices)):
            async for choice, event in events(choices):
                if isinstance(event, TextDelta):
                    if render.kind == "chat":
                        choice.deltas += on_text(choice, event)
                    else:
                        texts[choice.index].append(event.text)
                        choice.every += event.logprobs
                elif isinstance(event, Started):
                    continue
                elif isinstance(event, Failed):
                    return failure(event).response()
                elif event.reason == "cancelled" and not choice.output.done:
                    return client_closed()
                else:
                    choice.finished = event
        bodies = [_choice_body(c, render, "".join(texts[c.index])) for c in choices]
        return JSONResponse(render.completion(bodies, total_usage(choices), reasoning_tokens(choices)))
    finally:
        cancel_all(choices)  # no-ops once finished; stops the request if this task was cancelled


def _choice_body(choice: Choice, render: Renderer, text: str) -> dict[str, Any]:
    """A finished choice's body; its reasons are read after `message` (see `_finish_frames`)."""
    if render.kind != "chat":
        lp = completion_logprobs(choice.every) if choice.logprobs else None
        return render.text_choice(choice.index, text, choice.finish_reason(), lp, stop_reason=choice.stop_reason())
    content, calls, thinking = message(choice)
    lp = chat_logprobs(choice.every) if choice.logprobs else None
    finish, matched = choice.finish_reason(), choice.stop_reason()
    return render.chat_choice(choice.index, content, finish, calls, lp, stop_reason=matched, reasoning=thinking)
