"""Build an OpenAPI document for /v1/messages and /v1/messages/count_tokens from the anthropic SDK's request
types, for the fuzz tests (Anthropic publishes no OpenAPI document; its SDK's TypedDicts are the wire types).

    python tests/schemas/extract_anthropic_schemas.py > tests/schemas/anthropic_messages.json

Built with the installed `anthropic` package (its version is recorded in `info.version`) through pydantic's
JSON schema of `MessageCreateParams` and `MessageCountTokensParams`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anthropic
from anthropic.types import message_count_tokens_params, message_create_params
from pydantic import TypeAdapter

REF = "#/components/schemas/{model}"


def operation(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "operationId": name,
        "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
        "responses": {"200": {"description": "OK"}},
    }


def main() -> None:
    schemas: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for path, name, params in (
        ("/v1/messages", "MessageCreateParams", message_create_params.MessageCreateParams),
        ("/v1/messages/count_tokens", "MessageCountTokensParams", message_count_tokens_params.MessageCountTokensParams),
    ):
        schema = TypeAdapter(params).json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[name] = schema
        paths[path] = {"post": operation(name, {"$ref": REF.format(model=name)})}
    doc = {
        "openapi": "3.1.0",
        "info": {"title": "Anthropic Messages (from the anthropic SDK's types)", "version": anthropic.__version__},
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items()))},
    }
    json.dump(doc, sys.stdout, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
