"""The Responses API's stream events, typed, with OpenAI's names (`ResponseTextDeltaEvent`, ...). The stream
translation (`gateway.translate.responses_stream`) builds only these, each numbered by `sequence_number` as it
is made, and turns each into JSON once (`wire()`). The output items and the Response they carry are the JSON
objects `gateway.translate.responses` renders (the same for a non-streamed Response).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Json = dict[str, Any]


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sequence_number: int

    def wire(self) -> Json:
        return self.model_dump(mode="json")


class OutputTextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["output_text"] = "output_text"
    text: str = ""
    annotations: list[Any] = []
    logprobs: list[Any] = []


class SummaryTextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["summary_text"] = "summary_text"
    text: str = ""


class ResponseEvent(_Event):
    """response.created, .in_progress, .completed, .incomplete, .failed: the Response as it stands."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"
    ]
    response: Json


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: Json


class _InItem(_Event):
    item_id: str
    output_index: int


class ContentPartEvent(_InItem):
    type: Literal["response.content_part.added", "response.content_part.done"]
    content_index: int = 0
    part: OutputTextPart


class OutputTextDelta(_InItem):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    content_index: int = 0
    delta: str
    logprobs: list[Any] = []


class OutputTextDone(_InItem):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    content_index: int = 0
    text: str
    logprobs: list[Any] = []


class ArgumentsDelta(_InItem):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    delta: str


class ArgumentsDone(_InItem):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    name: str
    arguments: str


class SummaryPartEvent(_InItem):
    type: Literal["response.reasoning_summary_part.added", "response.reasoning_summary_part.done"]
    summary_index: int = 0
    part: SummaryTextPart


class SummaryTextDelta(_InItem):
    type: Literal["response.reasoning_summary_text.delta"] = "response.reasoning_summary_text.delta"
    summary_index: int = 0
    delta: str


class SummaryTextDone(_InItem):
    type: Literal["response.reasoning_summary_text.done"] = "response.reasoning_summary_text.done"
    summary_index: int = 0
    text: str


class KeepaliveEvent(_Event):
    """What OpenAI's own Responses streams send while a long request works: a few bytes, no Response."""

    type: Literal["keepalive"] = "keepalive"


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    code: str
    message: str
    param: str | None = None


StreamEvent = (
    ResponseEvent | OutputItemEvent | ContentPartEvent | OutputTextDelta | OutputTextDone | ArgumentsDelta
    | ArgumentsDone | SummaryPartEvent | SummaryTextDelta | SummaryTextDone | KeepaliveEvent | ErrorEvent
)  # fmt: skip
