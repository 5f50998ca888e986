"""The Responses API's stream events and output items, typed, with OpenAI's names (`ResponseTextDeltaEvent`,
`ResponseOutputMessage`, ...). The stream translation (`gateway.translate.responses_stream`) builds only these
events, each numbered by `sequence_number` as it is made, and turns each into JSON once (`wire()`); the output
items are the same for a streamed and a non-streamed Response (`gateway.translate.responses`). The Response
object around them is still the JSON object `gateway.translate.responses.response_object` renders.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from gateway.protocol.responses_api import ItemStatus

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


class OutputRefusal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["refusal"] = "refusal"
    refusal: str


class _Item(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str

    def wire(self) -> Json:
        return self.model_dump(mode="json")


class OutputMessage(_Item):
    """An assistant message item: its text part (and a refusal part where the model refused)."""

    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputTextPart | OutputRefusal]

    def text(self) -> str:
        """Its text parts' text."""
        return "".join(part.text for part in self.content if isinstance(part, OutputTextPart))


class OutputFunctionCall(_Item):
    """A function_call item; a namespace's function names `namespace` apart (absent otherwise, as OpenAI's)."""

    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    namespace: str | None = None
    arguments: str
    status: ItemStatus

    @model_serializer(mode="wrap")
    def _without_no_namespace(self, handler: SerializerFunctionWrapHandler) -> Json:
        out: Json = handler(self)
        if out.get("namespace") is None:
            out.pop("namespace", None)
        return out


class OutputReasoning(_Item):
    """A reasoning item whose summary is the model's thinking; nothing here encrypts (`encrypted_content` null)."""

    type: Literal["reasoning"] = "reasoning"
    summary: list[SummaryTextPart]
    encrypted_content: None = None
    status: ItemStatus


OutputItem = Annotated[OutputMessage | OutputFunctionCall | OutputReasoning, Field(discriminator="type")]
"""An item of a Response's `output`."""


class ResponseEvent(_Event):
    """response.created, .in_progress, .completed, .incomplete, .failed: the Response as it stands."""

    type: Literal[
        "response.created", "response.in_progress", "response.completed", "response.incomplete", "response.failed"
    ]
    response: Json


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


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
