"""Validate response bodies against OpenAI's own published schemas (tests/schemas/openai.json)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.jsonschema import DRAFT202012

SCHEMAS = Path(__file__).parent / "schemas" / "openai.json"


def _nullable_to_json_schema(node: Any) -> Any:
    """OpenAI's document still marks optional-null fields with OpenAPI 3.0's `nullable: true`; JSON Schema
    spells that as a "null" type (and a None enum member)."""
    if isinstance(node, list):
        return [_nullable_to_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_to_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        if "$ref" in out or "allOf" in out or "anyOf" in out or "oneOf" in out:
            out = {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def _validator(name: str) -> Draft202012Validator:
    document = _nullable_to_json_schema(json.loads(SCHEMAS.read_text()))
    registry: Registry = Registry().with_resource("urn:openai", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{name}"}, registry=registry)


def assert_matches_openai(name: str, body: Any) -> None:
    """Raise jsonschema.ValidationError if `body` is not a valid OpenAI `name` object."""
    _validator(name).validate(body)


def assert_completion_chunk(body: dict[str, Any]) -> None:
    """A streamed `/v1/completions` chunk against OpenAI's `CreateCompletionResponse`. OpenAI's schema shares one
    shape for streamed and whole completions, but its streams (and every client) carry `finish_reason` and `usage`
    null until the last chunk: those two are filled in (on a copy) and the rest of the shape checked strictly."""
    body = json.loads(json.dumps(body))
    if body.get("usage", 0) is None:
        del body["usage"]
    for choice in body.get("choices", []):
        choice["finish_reason"] = choice.get("finish_reason") or "stop"
    assert_matches_openai("CreateCompletionResponse", body)
