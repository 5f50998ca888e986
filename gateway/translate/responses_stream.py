"""Streamed chat chunks → the Responses API's event sequence, with a monotonically increasing sequence_number.

    response.created → response.in_progress
    per thinking run: output_item.added(reasoning) → reasoning_summary_part.added →
                    reasoning_summary_text.delta… → reasoning_summary_text.done → reasoning_summary_part.done →
                    output_item.done
    per text run:   output_item.added(message) → content_part.added → output_text.delta… →
                    output_text.done → content_part.done → output_item.done
    per tool call:  output_item.added(function_call) → function_call_arguments.delta… →
                    function_call_arguments.done → output_item.done
    response.completed | response.incomplete (max_output_tokens) — or, on failure, error → response.failed

Argument fragments are forwarded verbatim and concatenated for the `done` events, so a client's
accumulated arguments equal the model's bytes exactly; the chat tool-call id is the item's `call_id`. The
engine's thinking (`reasoning_content` deltas) is a reasoning item's summary, streamed with the summary
events Codex renders as its reasoning summary. Every event is one of `gateway.protocol.responses_events`,
validated as it is made (`_event`) and sent as its JSON.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import ErrorCode, GatewayError
from gateway.protocol.responses import ChatCompletionChunk, CompletionUsage, ToolCallDelta
from gateway.protocol.responses_api import ItemStatus, ResponsesRequest
from gateway.protocol.responses_events import (
    ArgumentsDelta,
    ArgumentsDone,
    ContentPartEvent,
    ErrorEvent,
    KeepaliveEvent,
    OutputFunctionCall,
    OutputItem,
    OutputItemEvent,
    OutputMessage,
    OutputReasoning,
    OutputTextDelta,
    OutputTextDone,
    OutputTextPart,
    ResponseEvent,
    StreamEvent,
    SummaryPartEvent,
    SummaryTextDelta,
    SummaryTextDone,
    SummaryTextPart,
)
from gateway.translate.ids import new_id
from gateway.translate.responses import (
    function_call_item,
    incomplete_reason,
    message_item,
    reasoning_item,
    response_error,
    response_object,
    usage,
)


@dataclass
class _Text:
    output_index: int
    item_id: str
    text: list[str] = field(default_factory=list)

    def item(self, status: ItemStatus, req: ResponsesRequest) -> OutputMessage:
        del req
        return message_item(self.item_id, "".join(self.text), status=status)


@dataclass
class _Reasoning:
    output_index: int
    item_id: str
    text: list[str] = field(default_factory=list)

    def item(self, status: ItemStatus, req: ResponsesRequest) -> OutputReasoning:
        del req
        return reasoning_item(self.item_id, "".join(self.text), status=status)


@dataclass
class _Call:
    output_index: int
    item_id: str
    call_id: str
    name: str
    arguments: list[str] = field(default_factory=list)

    def item(self, status: ItemStatus, req: ResponsesRequest) -> OutputFunctionCall:
        arguments = "".join(self.arguments)
        return function_call_item(self.item_id, self.call_id, self.name, arguments, status=status, req=req)


class ResponsesStream:
    """Translate one streamed chat completion into Responses events; one instance per request.

    Call `start()` (optional: the first `feed()` starts too) as soon as the stream opens, `feed()` with
    every typed chat chunk in order (usage chunks with `choices: []` included), then exactly one of
    `finish()` (the chat stream ended) or `fail()` (`broke()`: it broke); later calls return no events. Each call
    returns the events to send, in order. Items are sequential: a tool call whose arguments continue
    after another tool call has begun cannot be streamed faithfully, so `feed()` raises a 502
    `GatewayError` (upstream_error) for it; the caller then calls `fail()`. `refusal` deltas are not
    streamed (no engine here emits them; a non-streamed refusal becomes a refusal part). Not thread-safe.
    """

    def __init__(self, req: ResponsesRequest, *, response_id: str, created_at: int) -> None:
        self._req = req
        self._response_id = response_id
        self._created_at = created_at
        self._sequence = 0
        self._started = False
        self._final: dict[str, Any] | None = None
        self._output: list[OutputItem] = []
        self._current: _Text | _Reasoning | _Call | None = None
        self._calls: dict[int, _Call] = {}
        self._finish_reason: str | None = None
        self._usage: CompletionUsage | None = None
        self._model: str | None = None

    # -- public ---------------------------------------------------------------------------------------
    def start(self) -> list[dict[str, Any]]:
        """response.created and response.in_progress, once."""
        if self._started:
            return []
        self._started = True
        return [
            self._event(ResponseEvent, type="response.created", response=self._snapshot("in_progress")),
            self._event(ResponseEvent, type="response.in_progress", response=self._snapshot("in_progress")),
        ]

    def feed(self, chunk: ChatCompletionChunk) -> list[dict[str, Any]]:
        """The events for one `chat.completion.chunk`."""
        if self._final is not None:
            return []
        events = self.start()
        self._model = chunk.model or self._model
        if chunk.usage is not None:
            self._usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta.reasoning_content:
                events += self._on_reasoning(delta.reasoning_content)
            if delta.content:
                events += self._on_text(delta.content)
            for call in delta.tool_calls or ():
                events += self._on_tool_call(call)
            if choice.finish_reason:
                self._finish_reason = choice.finish_reason
        return events

    def finish(self, *, completed_at: int | None = None) -> list[dict[str, Any]]:
        """Close the open item and end with response.completed (or response.incomplete after "length")."""
        if self._final is not None:
            return []
        events = self.start()
        reason = incomplete_reason(self._finish_reason)
        status: ItemStatus = "incomplete" if reason else "completed"
        if all(item.type == "reasoning" for item in self._output):  # an empty answer is still one (empty)
            events += self._close_current(status)  # message, as non-streamed; after the thinking, if any
            events += self._open_text()
        events += self._close_current(status)
        self._final = response_object(
            self._req,
            response_id=self._response_id,
            created_at=self._created_at,
            completed_at=completed_at if completed_at is not None else int(time.time()),
            status=status,
            output=list(self._output),
            model=self._model,
            usage=usage(self._usage),
            incomplete_reason=reason,
        )
        events.append(self._event(ResponseEvent, type=f"response.{status}", response=self._final))
        return events

    def broke(self, status: int, message: str, code: str) -> list[dict[str, Any]]:
        """The chat stream broke (`message`, the gateway's `code`; `status` is implied by it): `fail()`."""
        del status
        return self.fail(message, code)

    def fail(self, message: str, code: str = "server_error") -> list[dict[str, Any]]:
        """An `error` event, then response.failed carrying what was produced so far (open items incomplete)."""
        if self._final is not None:
            return []
        events = self.start()
        current = self._current
        if current is not None:
            self._output[current.output_index] = current.item("incomplete", self._req)
            self._current = None
        error = response_error(message, code)
        events.append(self._event(ErrorEvent, code=error["code"], message=message, param=None))
        self._final = response_object(
            self._req,
            response_id=self._response_id,
            created_at=self._created_at,
            status="failed",
            output=list(self._output),
            model=self._model,
            usage=usage(self._usage),
            error=error,
        )
        events.append(self._event(ResponseEvent, type="response.failed", response=self._final))
        return events

    def keepalive(self) -> list[dict[str, Any]]:
        """A `keepalive` event (`{"type": "keepalive", "sequence_number": n}`) while the stream waits (queued,
        loading, prefilling): what OpenAI's own Responses streams send on a long request, a few bytes where
        `response.in_progress` would re-send the whole Response (instructions and tools) every interval. SSE
        comments are no activity to Codex, which drops a stream after `stream_idle_timeout_ms` without an
        event and skips event types it does not know; the openai SDKs pass it on as an event."""
        if self._final is not None:
            return []
        return [*self.start(), self._event(KeepaliveEvent)]

    def final_response(self) -> dict[str, Any]:
        """The Response as it ended (to store after streaming); while streaming, an in-progress snapshot."""
        return self._final if self._final is not None else self._snapshot("in_progress")

    # -- internals ------------------------------------------------------------------------------------
    def _event(self, kind: type[StreamEvent], **fields: Any) -> dict[str, Any]:
        """The next event of `kind` (validated: its fields are OpenAI's), numbered, as JSON."""
        event = kind(sequence_number=self._sequence, **fields)
        self._sequence += 1
        return event.wire()

    def _item_event(self, kind: str, output_index: int, item: OutputItem) -> dict[str, Any]:
        """response.output_item.added or .done (`kind`)."""
        return self._event(OutputItemEvent, type=f"response.output_item.{kind}", output_index=output_index, item=item)

    def _snapshot(self, status: str) -> dict[str, Any]:
        return response_object(
            self._req,
            response_id=self._response_id,
            created_at=self._created_at,
            status=status,
            output=list(self._output),
            model=self._model,
        )

    def _on_text(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if not isinstance(self._current, _Text):
            events += self._close_current("completed")
            events += self._open_text()
        current = self._current
        assert isinstance(current, _Text)
        current.text.append(text)
        events.append(
            self._event(
                OutputTextDelta,
                item_id=current.item_id,
                output_index=current.output_index,
                content_index=0,
                delta=text,
                logprobs=[],
            )
        )
        return events

    def _on_reasoning(self, text: str) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        current = self._current
        if not isinstance(current, _Reasoning):
            events += self._close_current("completed")
            current = _Reasoning(output_index=len(self._output), item_id=new_id("rs"))
            self._current = current
            item = current.item("in_progress", self._req)
            self._output.append(item)
            events += [
                self._item_event("added", current.output_index, item),
                self._event(SummaryPartEvent, type="response.reasoning_summary_part.added", **self._summary(current),
                            part=SummaryTextPart()),
            ]  # fmt: skip
        current.text.append(text)
        events.append(self._event(SummaryTextDelta, **self._summary(current), delta=text))
        return events

    @staticmethod
    def _summary(state: _Reasoning) -> dict[str, Any]:
        return {"item_id": state.item_id, "output_index": state.output_index, "summary_index": 0}

    def _open_text(self) -> list[dict[str, Any]]:
        current = _Text(output_index=len(self._output), item_id=new_id("msg"))
        self._current = current
        item = message_item(current.item_id, "", status="in_progress").model_copy(update={"content": []})
        self._output.append(item)
        where = {"item_id": current.item_id, "output_index": current.output_index}
        return [
            self._item_event("added", current.output_index, item),
            self._event(
                ContentPartEvent, type="response.content_part.added", **where, content_index=0, part=OutputTextPart()
            ),
        ]

    def _on_tool_call(self, delta: ToolCallDelta) -> list[dict[str, Any]]:
        index = delta.index
        name = delta.function.name if delta.function is not None else None
        fragment = delta.function.arguments if delta.function is not None else None
        call = self._calls.get(index)
        events: list[dict[str, Any]] = []
        if call is None or (delta.id and delta.id != call.call_id):
            events += self._close_current("completed")
            call = self._open_call(index, delta.id or new_id("call"), name or "")
            events.append(self._item_event("added", call.output_index, call.item("in_progress", self._req)))
        elif call is not self._current:
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                f"the model's tool call {index} continued after a later item began; it cannot be streamed in order",
            )
        elif name and not call.name:
            call.name = name
        if fragment:
            call.arguments.append(fragment)
            events.append(
                self._event(
                    ArgumentsDelta,
                    item_id=call.item_id,
                    output_index=call.output_index,
                    delta=fragment,
                )
            )
        return events

    def _open_call(self, index: int, call_id: str, name: str) -> _Call:
        call = _Call(output_index=len(self._output), item_id=new_id("fc"), call_id=call_id, name=name)
        self._calls[index] = call
        self._current = call
        self._output.append(call.item("in_progress", self._req))
        return call

    def _close_current(self, status: ItemStatus) -> list[dict[str, Any]]:
        current, self._current = self._current, None
        if current is None:
            return []
        item = self._output[current.output_index] = current.item(status, self._req)
        where = {"item_id": current.item_id, "output_index": current.output_index}
        if isinstance(item, OutputReasoning):
            summary = item.summary[0] if item.summary else SummaryTextPart()
            events = [
                self._event(SummaryTextDone, **where, summary_index=0, text=summary.text),
                self._event(
                    SummaryPartEvent,
                    type="response.reasoning_summary_part.done",
                    **where,
                    summary_index=0,
                    part=summary,
                ),
            ]
        elif isinstance(item, OutputMessage):
            part = OutputTextPart(text=item.text())
            events = [
                self._event(OutputTextDone, **where, content_index=0, text=part.text, logprobs=[]),
                self._event(ContentPartEvent, type="response.content_part.done", **where, content_index=0, part=part),
            ]
        else:
            events = [self._event(ArgumentsDone, **where, name=item.name, arguments=item.arguments)]
        events.append(self._item_event("done", current.output_index, item))
        return events
