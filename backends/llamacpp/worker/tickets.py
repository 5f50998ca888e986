"""What crosses the engine thread's boundary: requests in, events out, handed over once per engine step.

Concurrency contract
--------------------
* The engine thread appends events to an `Outbox` while it works through a step and calls `flush` once,
  right before its next `llama_decode`. `flush` only hands the step's events to the outbox's courier
  thread, which wakes each event loop with one `call_soon_threadsafe` per flush (not one per token).
* Why a courier: waking a loop is a socket write, which releases the GIL; the woken loop then takes the
  GIL for all of its per-token work, and the engine, back from the write, waited for it before it could
  start the next decode. The courier can only get the GIL once the engine has entered `llama_decode`
  (native code, GIL released), so the asyncio side works while the model computes.
* Events of one ticket arrive in the order they were put, and nothing follows its `Finished` or `Failed`.
  A ticket that asked for it gets `Started` first (when it takes its slot), then text.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from backends.llamacpp.worker.reasoning import ThinkingBudget
from backends.llamacpp.worker.sampling import SamplingParams

FinishReason = Literal["stop", "length", "cancelled"]


MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, eq=False)
class ImageSpan:
    """One image's place in a tokenized prompt: positions `start` to `start + n_tokens` of `prompt`.

    `chunk` is the image's `vision.ImageChunk` and `owner` the `vision.MultimodalPrompt` that holds its
    native memory (kept alive as long as the request is); both opaque here, so this module stays
    native-free. Only the engine thread evaluates the chunk (`Scheduler`'s image evaluator).
    """

    start: int
    n_tokens: int
    chunk: Any
    owner: Any

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass(frozen=True)
class GenerationRequest:
    """One tokenized request, ready for a slot.

    `logprobs`: None for none; k in 0..`MAX_TOP_LOGPROBS` for each generated token's log-probability and
    its k most likely alternatives (see `backends.llamacpp.worker.logprobs` for what they are computed from).
    """

    request_id: str
    prompt: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    logprobs: int | None = None
    shown_specials: frozenset[int] = frozenset()
    """Special tokens rendered as their text (a tool-call syntax's markers such as `[TOOL_CALLS]`), which
    otherwise render empty."""
    images: tuple[ImageSpan, ...] = ()
    """The prompt's images, in order. At their positions `prompt` holds placeholder ids (negative, one per
    image, from its digest: `vision.cache_tokens`), so prefix reuse matches only the same image; those
    positions are never put in a token batch."""
    report_start: bool = False
    """Put a `Started` event (the prompt's usage) when the request gets its slot."""
    session_key: str | None = None
    """The gateway's session key (`EngineRequest.session_key`): the same key, the same conversation. Its
    slot's state is worth keeping in host memory (`prompt_cache.SavePolicy`)."""
    thinking_budget: ThinkingBudget | None = None
    """Close the thinking with forced tokens once this many tokens were generated inside it."""

    def __post_init__(self) -> None:
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be in 0..{MAX_TOP_LOGPROBS}, not {self.logprobs}")
        if self.images and self.images[-1].end >= len(self.prompt):
            raise ValueError("a prompt must not end with an image: its last token's logits start generation")

    def image_at(self, position: int) -> ImageSpan | None:
        """The image that starts at `position`, if one does."""
        return next((image for image in self.images if image.start == position), None)

    def text_end(self, position: int) -> int:
        """Where the text run from `position` ends: at the next image's start, or at the prompt's end."""
        return next((image.start for image in self.images if image.start >= position), len(self.prompt))

    def reusable(self, n_common: int) -> int:
        """A cached prefix of `n_common` tokens, cut back to an image's start if it ends inside the image
        (an image's embeddings are decoded whole)."""
        for image in self.images:
            if image.start < n_common < image.end:
                return image.start
        return n_common


@dataclass(frozen=True)
class Usage:
    """One sequence's token counts. `cached_tokens`: prompt tokens it did not prefill itself (KV reused from
    an earlier request's prefix, or copied from its group's leader: see `Scheduler.submit_group`)."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class TopLogprob:
    """One of the most likely tokens at a position: `token` is its text (UTF-8, invalid bytes as U+FFFD),
    `bytes` its raw bytes (a multi-byte character may be split between tokens)."""

    token_id: int
    token: str
    bytes: tuple[int, ...]
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability and, most likely first, the `top` alternatives it was asked for
    (they include the token itself when it is among them)."""

    token_id: int
    token: str
    bytes: tuple[int, ...]
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True)
class TextDelta:
    """Text released to the client, with the log-probabilities of the tokens that produced it.

    Text can be held back (a possible stop string, an incomplete UTF-8 character), so a token's entry rides
    with the delta that releases the end of its text: a delta may carry entries of tokens generated steps
    ago, and the last delta of a sequence may have empty `text` when it only carries entries (tokens that
    produced no text of their own). Tokens whose text vanished into a matched stop string have no entry;
    neither does an end-of-generation token.
    """

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Started:
    """The request has its slot: `usage` counts its prompt and the part of it reused from the cache (0
    completion tokens). Put only for a request that asked (`GenerationRequest.report_start`), before any
    other event of its ticket."""

    usage: Usage


@dataclass(frozen=True)
class Finished:
    """The sequence ended. `matched`: the stop string (one of the request's `stop`) that ended it, when one
    did (`reason` is then "stop"); None on an end-of-generation token, a limit or a cancel."""

    reason: FinishReason
    usage: Usage
    matched: str | None = None


@dataclass(frozen=True)
class Failed:
    message: str
    retryable: bool = False  # True when the worker is shutting down, not when the request broke it
    invalid: bool = False  # True when the request asked for what cannot be served (a 400): a grammar too slow


Event = Started | TextDelta | Finished | Failed


class Ticket:
    """The asyncio side of one submitted request: its event stream and its cancel switch."""

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, wake: Callable[[], None]):
        self.request = request
        self.loop = loop
        self._wake = wake
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()

    async def next_event(self) -> Event:
        return await self._events.get()

    def cancel(self) -> None:
        """Ask the engine to drop this request (thread-safe, idempotent, a no-op once finished)."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def receive(self, event: Event) -> None:
        """Called on the ticket's event loop (by `Outbox.flush`'s callback)."""
        self._events.put_nowait(event)


def _dispatch(items: list[tuple[Ticket, Event]]) -> None:
    for ticket, event in items:
        ticket.receive(event)


_Flushed = dict[asyncio.AbstractEventLoop, list[tuple[Ticket, Event]]]


class Outbox:
    """Events the engine produced since the last flush, grouped by the event loop that consumes them."""

    def __init__(self) -> None:
        self._pending: _Flushed = {}
        self._flushed: queue.SimpleQueue[_Flushed | None] = queue.SimpleQueue()  # None: stop the courier
        self._courier = threading.Thread(target=self._deliver, name="llama-outbox", daemon=True)

    def start(self) -> None:
        self._courier.start()

    def put(self, ticket: Ticket, event: Event) -> None:
        """Queue an event for the next flush (engine thread)."""
        items = self._pending.get(ticket.loop)
        if items is None:
            self._pending[ticket.loop] = [(ticket, event)]
        else:
            items.append((ticket, event))

    def flush(self) -> None:
        """Hand the queued events to the courier (engine thread; never waits on an event loop)."""
        if self._pending:
            self._flushed.put(self._pending)
            self._pending = {}

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush, let the courier deliver everything handed over so far, and stop it."""
        self.flush()
        self._flushed.put(None)
        if self._courier.is_alive():
            self._courier.join(timeout_s)

    def _deliver(self) -> None:
        while (pending := self._flushed.get()) is not None:
            for loop, items in pending.items():
                # RuntimeError: the event loop is closed, so nobody is listening any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_dispatch, items)


class QueueFullError(Exception):
    """Every slot is busy and `max_queue` requests already wait for one (`Scheduler.submit`)."""


class SchedulerClosedError(Exception):
    """The engine has stopped (shutdown or a fatal llama.cpp error)."""
