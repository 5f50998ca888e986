"""The gateway's own OpenAPI document, made to describe what the gateway really answers.

FastAPI's generated document needs three corrections, applied once when /openapi.json is first built:
request bodies' nested models are hoisted into `components.schemas` (their `$ref`s dangle otherwise);
every operation documents the OpenAI error envelope as its `default` response, and never FastAPI's 422
(validation errors are 400s here); operations whose body has `stream` also document `text/event-stream`.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERROR_RESPONSE: dict[str, Any] = {
    "description": "An error in OpenAI's shape (429 and 503 carry Retry-After)",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}},
}
# Before OpenAPI 3.2 (`itemSchema`) the `schema` of text/event-stream describes each event, not the stream's text.
SSE_CONTENT: dict[str, Any] = {
    "schema": {
        "type": "object",
        "description": "One server-sent event: `data:` a JSON chunk (chat and completions end with `[DONE]`); "
        "the Responses and Messages streams name each event's type in `event:`",
        "required": ["data"],
        "properties": {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}},
    }
}
# Operations whose answers are not the JSON FastAPI assumes for a bare `Response`.
SPECIAL_RESPONSES: dict[str, dict[str, Any]] = {
    "/metrics": {
        "200": {"description": "Prometheus text format", "content": {"text/plain": {"schema": {"type": "string"}}}}
    },
    "/ready": {
        "503": {
            "description": "Some model is not ready (loading, restarting, refused) or the gateway is stopping",
            "content": {"application/json": {"schema": {"type": "object", "required": ["status", "models"]}}},
        }
    },
}


def install_openapi(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        return _complete(generate())

    app.openapi = openapi  # type: ignore[method-assign]


def _complete(schema: dict[str, Any]) -> dict[str, Any]:
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for path, operations in schema.get("paths", {}).items():
        for operation in operations.values():
            streams = False
            for media in operation.get("requestBody", {}).get("content", {}).values():
                body = media.get("schema", {})
                components.update(body.pop("$defs", {}))
                streams = streams or "stream" in body.get("properties", {})
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            responses["default"] = ERROR_RESPONSE
            if streams:
                responses.setdefault("200", {"description": "OK"}).setdefault("content", {})
                responses["200"]["content"]["text/event-stream"] = SSE_CONTENT
            responses.update(SPECIAL_RESPONSES.get(path, {}))
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    components["ErrorResponse"] = ERROR_SCHEMA
    return schema
