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


@cache
def _validator(name: str) -> Draft202012Validator:
    document = json.loads(SCHEMAS.read_text())
    registry: Registry = Registry().with_resource("urn:openai", DRAFT202012.create_resource(document))
    return Draft202012Validator({"$ref": f"urn:openai#/components/schemas/{name}"}, registry=registry)


def assert_matches_openai(name: str, body: Any) -> None:
    """Raise jsonschema.ValidationError if `body` is not a valid OpenAI `name` object."""
    _validator(name).validate(body)
