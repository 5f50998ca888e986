"""Extract the Responses API schemas the translation tests validate against from OpenAI's OpenAPI document.

    python tests/schemas/extract_responses_schemas.py openai-openapi/openapi.json \
        > tests/schemas/openai_responses.json

Source: openai/openai-openapi (commit f85dbe2), MIT licence. The named schemas and everything they reference
are kept, with prose (descriptions, examples) dropped to keep the file small; validation keywords are untouched.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from extract_openai_schemas import refs

ROOTS = [
    "Response",
    "ResponseStreamEvent",
    "ResponseCreatedEvent",
    "ResponseInProgressEvent",
    "ResponseOutputItemAddedEvent",
    "ResponseOutputItemDoneEvent",
    "ResponseContentPartAddedEvent",
    "ResponseContentPartDoneEvent",
    "ResponseTextDeltaEvent",
    "ResponseTextDoneEvent",
    "ResponseFunctionCallArgumentsDeltaEvent",
    "ResponseFunctionCallArgumentsDoneEvent",
    "ResponseCompletedEvent",
    "ResponseIncompleteEvent",
    "ResponseFailedEvent",
    "ResponseErrorEvent",
    "CreateResponse",
    "ResponseItemList",
]
PROSE = {"description", "example", "examples", "title", "x-oaiMeta"}


def strip(node: object, *, names: bool = False) -> object:
    """Drop prose keys; `names`: `node` maps property names to schemas (a property may be called "title")."""
    if isinstance(node, dict):
        return {
            k: strip(v, names=k in ("properties", "patternProperties") and not names)
            for k, v in node.items()
            if names or k not in PROSE
        }
    if isinstance(node, list):
        return [strip(v) for v in node]
    return node


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
    document = {"openapi": spec["openapi"], "components": {"schemas": strip(dict(sorted(keep.items())), names=True)}}
    json.dump(document, sys.stdout, indent=None, separators=(",", ":"))
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
