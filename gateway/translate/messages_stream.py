"""Streamed chat chunks → Anthropic's Messages stream events.

    ping…  (while it waits: queued, loading, or until its prompt has a slot)
    message_start → ping
    per thinking run: content_block_start(thinking) → content_block_delta(thinking_delta)… →
                   content_block_delta(signature_delta) → content_block_stop
    per text run:  content_block_start(text) → content_block_delta(text_delta)… → content_block_stop
    per tool call: content_block_start(tool_use) → content_block_delta(input_json_delta)… → content_block_stop
    message_delta (stop_reason, stop_sequence, usage) → message_stop        — or, on failure, error

message_start goes out with the first chat chunk, whose `usage` (asked with the engine request's
`stream_options.include_prompt_usage`, which our llama.cpp worker honours once the prompt has its slot)
gives its `input_tokens` and `cache_read_input_tokens`, as Anthropic's message_start has them (Claude Code
reads them there). A first chunk without usage (LMDeploy, a remote endpoint) leaves them 0 until
message_delta, which always carries the final `input_tokens`, `cache_read_input_tokens` (the prompt's
prefix-cache hit) and `output_tokens`. Anthropic's SDKs skip `ping` wherever it comes.
Argument fragments are forwarded verbatim as `partial_json`; tool-use ids are the chat tool-call ids. A
chunk's `reasoning_content` (the engine's thinking) is a thinking block, closed with the placeholder
signature (`SIGNATURE`) that Anthropic's SDKs and Claude Code expect of one. Events are built typed
(`gateway.protocol.anthropic_events`) and leave as JSON objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.anthropic_events import (
    ContentBlockDelta,
    ContentBlockStart,
    ContentBlockStop,
    DeltaUsage,
    InputJsonDelta,
    MessageBody,
    MessageDelta,
    MessageStart,
    MessageStop,
    OutputBlock,
    Ping,
    SignatureDelta,
    StopDelta,
    StopReason,
    StreamEvent,
    TextContent,
    TextDelta,
    ThinkingContent,
    ThinkingDelta,
    ToolUseContent,
    Usage,
)
from gateway.protocol.responses import ChatCompletionChunk, CompletionUsage, ToolCallDelta
from gateway.translate.ids import new_id
from gateway.translate.messages import SIGNATURE, anthropic_error, stop_reason, tool_input, usage


@dataclass
class _Text:
    index: int
    text: list[str] = field(default_factory=list)


@dataclass
class _Thinking:
    index: int
    text: list[str] = field(default_factory=list)


@dataclass
class _ToolUse:
    index: int
    id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class MessagesStream:
    """Translate one streamed chat completion into Anthropic stream events; one instance per request.

    Call `feed()` with every typed chat chunk in order (the first opens the message), `keepalive()` while
    waiting, then exactly one of `finish()` or `fail()` (`broke()`); later calls return no events (an end
    before any chunk opens the message first, with zero usage). Blocks are
    sequential: a tool call whose arguments continue after a later block began cannot be streamed
    faithfully, so `feed()` raises a 502 `GatewayError` for it; the caller then calls `fail()`.
    Not thread-safe.
    """

    def __init__(self, req: MessagesRequest, *, message_id: str) -> None:
        self._req = req
        self._message_id = message_id
        self._started = False
        self._ended = False
        self._blocks: list[_Text | _Thinking | _ToolUse] = []
        self._current: _Text | _Thinking | _ToolUse | None = None
        self._calls: dict[int, _ToolUse] = {}
        self._finish_reason: str | None = None
        self._matched: str | int | None = None
        self._usage: CompletionUsage | None = None

    def start(self) -> list[dict[str, Any]]:
        """Nothing at once: message_start waits for the first chunk and its prompt usage (`feed`)."""
        return []

    def keepalive(self) -> list[dict[str, Any]]:
        """A `ping` event while the stream waits (queued, loading, prefilling), as Anthropic's streams have
        them: SDKs and Claude Code count events, not SSE comments, as activity."""
        return [] if self._ended else [Ping().wire()]

    def feed(self, chunk: ChatCompletionChunk) -> list[dict[str, Any]]:
        """The events for one `chat.completion.chunk`."""
        if self._ended:
            return []
        if chunk.usage is not None:
            self._usage = chunk.usage
        events = self._begin()
        for choice in chunk.choices:
            delta = choice.delta
            if delta.reasoning_content:
                events += self._on_thinking(delta.reasoning_content)
            if delta.content:
                events += self._on_text(delta.content)
            for call in delta.tool_calls or ():
                events += self._on_tool_call(call)
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
                self._matched = choice.matched
        return _wire(events)

    def finish(self) -> list[dict[str, Any]]:
        """Close the open block, then message_delta (stop reason, usage) and message_stop."""
        if self._ended:
            return []
        events = self._begin()
        events += self._close_current()
        self._ended = True
        reason, sequence = self._stop()
        delta = MessageDelta(delta=StopDelta(stop_reason=reason, stop_sequence=sequence), usage=self._delta_usage())
        return _wire([*events, delta, MessageStop()])

    def broke(self, status: int, message: str, code: str) -> list[dict[str, Any]]:
        """The chat stream broke (`status`, `message`; `code` is the gateway's): `fail()`."""
        del code
        return self.fail(status, message)

    def fail(self, status: int, message: str) -> list[dict[str, Any]]:
        """One `error` event in Anthropic's envelope (the type from `status`); the stream then ends."""
        if self._ended:
            return []
        self._ended = True
        return [*_wire(self._begin()), anthropic_error(status, message)]

    def final_message(self) -> dict[str, Any]:
        """The Message as accumulated so far; tool inputs parsed (a non-object raises a 502 `GatewayError`)."""
        content: list[OutputBlock] = []
        for block in self._blocks:
            if isinstance(block, _Text):
                content.append(TextContent(text="".join(block.text)))
            elif isinstance(block, _Thinking):
                content.append(ThinkingContent(thinking="".join(block.text), signature=SIGNATURE))
            else:
                arguments = "".join(block.arguments)
                content.append(ToolUseContent(id=block.id, name=block.name, input=tool_input(block.name, arguments)))
        reason, sequence = self._stop() if self._ended else (None, None)
        return self._message(content, reason, sequence).wire()

    # -- internals ------------------------------------------------------------------------------------
    def _begin(self) -> list[StreamEvent]:
        """message_start (with the usage known so far: the first chunk's prompt counts) and a ping, once."""
        if self._started:
            return []
        self._started = True
        return [MessageStart(message=self._message([], None, None)), Ping()]

    def _message(self, content: list[OutputBlock], reason: StopReason | None, sequence: str | None) -> MessageBody:
        return MessageBody(
            id=self._message_id, model=self._req.model, content=content, stop_reason=reason, stop_sequence=sequence,
            usage=Usage(**usage(self._usage)),
        )  # fmt: skip

    def _stop(self) -> tuple[StopReason, str | None]:
        return stop_reason(
            self._finish_reason,
            tool_calls=bool(self._calls),
            matched=self._matched,
            stop_sequences=self._req.stop_sequences,
        )

    def _delta_usage(self) -> DeltaUsage:
        """The output tokens, and the input counts when the engine sent usage."""
        counted = usage(self._usage)
        if self._usage is None:
            return DeltaUsage(output_tokens=counted["output_tokens"])
        return DeltaUsage(**counted)

    def _on_text(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        current = self._current
        if not isinstance(current, _Text):
            events += self._close_current()
            current = _Text(index=len(self._blocks))
            self._open(current)
            events.append(ContentBlockStart(index=current.index, content_block=TextContent()))
        current.text.append(text)
        events.append(ContentBlockDelta(index=current.index, delta=TextDelta(text=text)))
        return events

    def _on_thinking(self, text: str) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        current = self._current
        if not isinstance(current, _Thinking):
            events += self._close_current()
            current = _Thinking(index=len(self._blocks))
            self._open(current)
            events.append(ContentBlockStart(index=current.index, content_block=ThinkingContent()))
        current.text.append(text)
        events.append(ContentBlockDelta(index=current.index, delta=ThinkingDelta(thinking=text)))
        return events

    def _on_tool_call(self, delta: ToolCallDelta) -> list[StreamEvent]:
        index = delta.index
        name = delta.function.name if delta.function is not None else None
        fragment = delta.function.arguments if delta.function is not None else None
        call = self._calls.get(index)
        events: list[StreamEvent] = []
        if call is None or (delta.id and delta.id != call.id):
            events += self._close_current()
            call = _ToolUse(index=len(self._blocks), id=delta.id or new_id("call"), name=name or "")
            self._calls[index] = call
            self._open(call)
            block = ToolUseContent(id=call.id, name=call.name, input={})
            events.append(ContentBlockStart(index=call.index, content_block=block))
        elif call is not self._current:
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                f"the model's tool call {index} continued after a later block began; it cannot be streamed in order",
            )
        elif name and not call.name:
            call.name = name
        if fragment:
            call.arguments.append(fragment)
            events.append(ContentBlockDelta(index=call.index, delta=InputJsonDelta(partial_json=fragment)))
        return events

    def _open(self, block: _Text | _Thinking | _ToolUse) -> None:
        self._blocks.append(block)
        self._current = block

    def _close_current(self) -> list[StreamEvent]:
        """content_block_stop for the open block; a thinking block's signature_delta first."""
        current, self._current = self._current, None
        if current is None:
            return []
        events: list[StreamEvent] = []
        if isinstance(current, _Thinking):
            events.append(ContentBlockDelta(index=current.index, delta=SignatureDelta(signature=SIGNATURE)))
        return [*events, ContentBlockStop(index=current.index)]


def _wire(events: list[StreamEvent]) -> list[dict[str, Any]]:
    return [event.wire() for event in events]
