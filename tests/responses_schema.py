"""Validate Responses API objects and stream events against OpenAI's published schemas
(tests/schemas/openai_responses.json, extracted by tests/schemas/extract_responses_schemas.py)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

from tests.openai_schema import _nullable_to_json_schema

SCHEMAS = Path(__file__).parent / "schemas" / "openai_responses.json"

EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
    "response.reasoning_summary_part.added": "ResponseReasoningSummaryPartAddedEvent",
    "response.reasoning_summary_part.done": "ResponseReasoningSummaryPartDoneEvent",
    "response.reasoning_summary_text.delta": "ResponseReasoningSummaryTextDeltaEvent",
    "response.reasoning_summary_text.done": "ResponseReasoningSummaryTextDoneEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.failed": "ResponseFailedEvent",
    "error": "ResponseErrorEvent",
}


@cache
def _validator(name: str) -> Draft202012Validator:
    document = _nullable_to_json_schema(json.loads(SCHEMAS.read_text()))
    registry: Registry = Registry().with_resource("urn:openai", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{name}"}, registry=registry)


def assert_matches(name: str, body: Any) -> None:
    """Raise jsonschema.ValidationError if `body` is not a valid OpenAI `name` object."""
    _validator(name).validate(body)


def assert_event_matches(event: dict[str, Any]) -> None:
    """Validate one stream event against its own event schema (chosen by `type`). `keepalive` is OpenAI's own
    keep-alive event, which its published schema leaves out: exactly `type` and `sequence_number`."""
    if event["type"] == "keepalive":
        assert set(event) == {"type", "sequence_number"} and isinstance(event["sequence_number"], int), event
        return
    assert_matches(EVENT_SCHEMAS[event["type"]], event)
