"""Extract the operations voltgate serves from OpenAI's published OpenAPI document, for the fuzz tests.

    python tests/schemas/extract_openai_operations.py openai-openapi/openapi.json \
        > tests/schemas/openai_operations.json

Source: openai/openai-openapi (commit f85dbe2), MIT licence. Kept: the operations below, every component they
reference (transitively), nothing else; OpenAI's documentation extensions (`x-oaiMeta`, ...) and security
requirements are dropped, and the server is `/v1` on whatever host the test points it at.
"""

from __future__ import annotations

import json
import sys
from typing import Any

OPERATIONS = {
    "/chat/completions": ["post"],
    "/completions": ["post"],
    "/embeddings": ["post"],
    "/models": ["get"],
    "/models/{model}": ["get"],
    "/responses": ["post"],
    "/responses/{response_id}": ["get", "delete"],
    "/responses/{response_id}/input_items": ["get"],
    "/responses/{response_id}/cancel": ["post"],
    "/responses/input_tokens": ["post"],
}


def strip(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: strip(v) for k, v in node.items() if not k.startswith("x-oai") and k != "security"}
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


def refs(node: Any) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/"):
            kind, name = ref[len("#/components/") :].split("/", 1)
            found.add((kind, name))
        for value in node.values():
            found |= refs(value)
    elif isinstance(node, list):
        for value in node:
            found |= refs(value)
    return found


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    paths = {path: {m: strip(spec["paths"][path][m]) for m in methods} for path, methods in OPERATIONS.items()}
    components: dict[str, dict[str, Any]] = {}
    todo = list(refs(paths))
    while todo:
        kind, name = todo.pop()
        if name in components.get(kind, {}):
            continue
        node = strip(spec["components"][kind][name])
        components.setdefault(kind, {})[name] = node
        todo.extend(refs(node))
    doc = {
        "openapi": spec["openapi"],
        "info": {"title": "OpenAI API (the operations voltgate serves)", "version": spec["info"]["version"]},
        "servers": [{"url": "/v1"}],
        "paths": paths,
        "components": {kind: dict(sorted(items.items())) for kind, items in sorted(components.items())},
    }
    json.dump(doc, sys.stdout, indent=None, separators=(",", ":"), sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
