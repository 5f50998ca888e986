"""A request's choices (`n` ≥ 1) from engine events to OpenAI bodies: streamed chunks interleaved by index,
or one completion object.

Each choice has its own ticket (the scheduler runs them as one group sharing the prompt's KV), its own
`ChatOutput` (text or tool calls), its own `finish_reason` and, when a stop string ended it, its
`stop_reason` (that string, as vLLM names it). Usage counts the prompt once and every choice's completion
tokens. Log-probabilities ride with the chunk that carries their token's text; a token whose text is still
held back (a possible stop string or tool call) goes out with the next chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.errors import ErrorCode
from backends.llamacpp.worker.httpkit import WorkerError
from backends.llamacpp.worker.output import ChatOutput, assemble, reasoning_text
from backends.llamacpp.worker.tickets import Event, Failed, Finished, TextDelta, Ticket, TokenLogprob, Usage
from backends.llamacpp.worker.wire import ResponseFinish

Body = dict[str, Any]


@dataclass
class Choice:
    index: int
    ticket: Ticket
    output: ChatOutput
    logprobs: bool
    pending: list[TokenLogprob] = field(default_factory=list)
    every: list[TokenLogprob] = field(default_factory=list)
    deltas: list[Body] = field(default_factory=list)
    finished: Finished | None = None

    def take_logprobs(self) -> list[TokenLogprob]:
        taken, self.pending = self.pending, []
        return taken

    def finish_reason(self) -> ResponseFinish:
        assert self.finished is not None
        if self.output.calls and (self.finished.reason == "stop" or self.output.done):
            return "tool_calls"
        return "length" if self.finished.reason == "length" else "stop"

    def stop_reason(self) -> str | None:
        """The stop string that ended the choice (vLLM's `stop_reason`), when one did and the choice ends
        "stop": None on an end-of-generation token, at `length`, and for a choice that ends in tool calls."""
        assert self.finished is not None
        matched = self.finished.matched or self.output.matched
        return matched if self.finish_reason() == "stop" else None


def failure(event: Failed) -> WorkerError:
    if event.retryable:
        return WorkerError(ErrorCode.WORKER_UNAVAILABLE, event.message)
    if event.invalid:
        return WorkerError(ErrorCode.INVALID_REQUEST, event.message)
    return WorkerError(ErrorCode.INTERNAL_ERROR, event.message)


def reasoning_tokens(choices: Sequence[Choice]) -> int | None:
    """Every choice's tokens generated inside the thinking; None when the model has no reasoning syntax."""
    if not any(c.output.reasons for c in choices):
        return None
    return sum(c.output.reasoning_tokens for c in choices)


def total_usage(choices: Sequence[Choice]) -> Usage:
    """The prompt once (the group shares it), plus every choice's completion tokens."""
    first = choices[0].finished
    assert first is not None
    completion = sum(c.finished.usage.completion_tokens for c in choices if c.finished is not None)
    return Usage(first.usage.prompt_tokens, completion, first.usage.cached_tokens)


def cancel_all(choices: Sequence[Choice]) -> None:
    for choice in choices:
        choice.ticket.cancel()  # no-op once finished


async def events(choices: Sequence[Choice]) -> AsyncIterator[tuple[Choice, Event]]:
    """Every choice's events as they come, until each has finished (or one failed)."""
    if len(choices) == 1:  # the common case: no tasks, no extra queue
        while True:
            event = await choices[0].ticket.next_event()
            yield choices[0], event
            if isinstance(event, (Finished, Failed)):
                return
    queue: asyncio.Queue[tuple[Choice, Event]] = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        while True:
            event = await choice.ticket.next_event()
            queue.put_nowait((choice, event))
            if isinstance(event, (Finished, Failed)):
                return

    tasks = [asyncio.create_task(pump(c)) for c in choices]
    try:
        open_choices = len(choices)
        while open_choices:
            item = await queue.get()
            if isinstance(item[1], (Finished, Failed)):
                open_choices -= 1
            yield item
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


def on_text(choice: Choice, event: TextDelta) -> list[Body]:
    """The deltas a text event makes final; stops the choice once its tool calls are complete."""
    if choice.logprobs:
        choice.pending += event.logprobs
        choice.every += event.logprobs
    deltas = choice.output.push(event.text) if event.text else []
    if choice.output.done:
        choice.ticket.cancel()  # the reply's calls are complete: stop generating
    return deltas


def chat_logprobs(entries: Sequence[TokenLogprob]) -> Body:
    """OpenAI's chat `logprobs` object: one entry per token, with its top alternatives."""
    return {"content": [_entry(e) for e in entries], "refusal": None}


def _entry(e: TokenLogprob) -> Body:
    top = [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes)} for t in e.top]
    return {"token": e.token, "logprob": e.logprob, "bytes": list(e.bytes), "top_logprobs": top}


def completion_logprobs(entries: Sequence[TokenLogprob], offset: int = 0) -> Body:
    """The legacy completions `logprobs` object (tokens, token_logprobs, top_logprobs, text_offset)."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries],
        "text_offset": offsets,
    }


def message(choice: Choice) -> tuple[str | None, list[Body], str | None]:
    """A finished choice's content, tool calls and thinking (`reasoning_content`) (the unary path)."""
    deltas = choice.deltas + choice.output.finish()
    content, calls = assemble(deltas)
    return content, calls, reasoning_text(deltas)
