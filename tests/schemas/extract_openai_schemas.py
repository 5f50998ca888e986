"""Extract the response schemas the tests validate against from OpenAI's published OpenAPI document.

    python tests/schemas/extract_openai_schemas.py openai-openapi/openapi.json > tests/schemas/openai.json

Source: openai/openai-openapi (commit f85dbe2), MIT licence. Only the named schemas and everything they
reference are kept, so the test suite is self-contained in a fresh clone.
"""

from __future__ import annotations

import json
import sys

ROOTS = [
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "ListModelsResponse",
    "Model",
    "ErrorResponse",
    "CreateEmbeddingResponse",
]


def refs(node: object) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            found.add(ref.rsplit("/", 1)[1])
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    schemas = spec["components"]["schemas"]
    keep: dict[str, object] = {}
    todo = list(ROOTS)
    while todo:
        name = todo.pop()
        if name in keep:
            continue
        keep[name] = schemas[name]
        todo.extend(refs(schemas[name]) - keep.keys())
    json.dump({"openapi": spec["openapi"], "components": {"schemas": dict(sorted(keep.items()))}}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
