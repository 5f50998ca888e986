"""The one chunk loop of the translated APIs: typed chat chunks in, one API's stream events out.

Responses (`ResponsesStream`) and Messages (`MessagesStream`) each render the same typed chunks into their
own events, as llama.cpp's server renders one typed result per API; the loop around them, what to do with
a keep-alive, a broken stream or an answer that cannot be rendered, is written once, here.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.protocol.responses import ChatCompletionChunk
from gateway.serving.relay import StreamFailure
from gateway.translate.sse import encode_events

Events = list[dict[str, Any]]


class ChunkRenderer(Protocol):
    """One API's rendering of a chat stream (one instance per request; see `MessagesStream`)."""

    def start(self) -> Events:
        """What goes out at once (Responses: response.created; Messages: nothing, its message_start waits
        for the first chunk's prompt usage)."""
        ...

    def keepalive(self) -> Events:
        """An event that counts as activity while the stream waits."""
        ...

    def feed(self, chunk: ChatCompletionChunk) -> Events:
        """The events for one chunk; raises `GatewayError` when the answer cannot be rendered in order."""
        ...

    def broke(self, status: int, message: str, code: str) -> Events:
        """The stream's end when it broke (an error event in the API's own shape)."""
        ...

    def finish(self) -> Events:
        """The stream's end when the chat stream ended."""
        ...


class ChunkSource(Protocol):
    """A streamed chat request (`gateway.serving.session.StreamSession`)."""

    def chunks(self) -> AsyncGenerator[ChatCompletionChunk | StreamFailure | bytes, None]: ...

    def translation_failed(self, exc: GatewayError) -> None: ...


async def translated_events(
    session: ChunkSource, renderer: ChunkRenderer, *, before_end: Callable[[], Awaitable[None]] | None = None
) -> AsyncIterator[bytes]:
    """The API's event stream over the session's chunks: its start at once (if any), a keep-alive event with every
    comment said while it waits, the events of each chunk, and one end (`finish`, or `broke` when the stream
    broke or could not be rendered). `before_end` runs just before the end is sent (Responses stores the
    response there). The session is closed by the caller."""
    opening = renderer.start()
    if opening:
        yield encode_events(opening)
    ending: Events | None = None
    async with contextlib.aclosing(session.chunks()) as chunks:
        try:
            async for item in chunks:
                if isinstance(item, bytes):  # a comment while it waits: with an event, which clients count
                    yield item + encode_events(renderer.keepalive())
                elif isinstance(item, StreamFailure):  # the chat stream broke after its headers were sent
                    ending = renderer.broke(item.status, item.message, item.code)
                    break
                else:
                    events = renderer.feed(item)
                    if events:
                        yield encode_events(events)
        except GatewayError as exc:  # the model's output cannot be streamed as this API's events
            session.translation_failed(exc)
            ending = renderer.broke(exc.status, exc.message, exc.code.value)
    if ending is None:
        ending = renderer.finish()
    if before_end is not None:
        await before_end()
    yield encode_events(ending)
