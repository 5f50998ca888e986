"""Tools as compact signatures (the generic format's system prompt): nothing the model needs is dropped."""

from __future__ import annotations

import json
from typing import Any

from backends.llamacpp.worker.tools.signatures import signature, signatures
from backends.request import Tool
from tests.clients.fixtures import load


def tool(parameters: dict[str, Any] | None, name: str = "f", description: str | None = "Does f.") -> Tool:
    return Tool.model_validate(
        {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}
    )


def test_required_optional_and_defaulted_parameters_are_told_apart() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "default": 1, "minimum": 1},
        },
        "required": ["city"],
    }
    assert signature(tool(schema, "get_weather", "Current weather.")) == (
        'get_weather(city: string, unit?: "celsius" | "fahrenheit", days: integer = 1)\n'
        "  Current weather.\n"
        "  city: City name, e.g. Paris\n"
        "  days: (minimum: 1)"
    )


def test_nested_arrays_objects_refs_and_unions_keep_their_types_and_descriptions() -> None:
    schema = {
        "type": "object",
        "$defs": {
            "Status": {"enum": ["pending", "done"]},
            "Task": {"type": "object", "title": "Task", "properties": {
                "content": {"type": "string", "description": "What to do."},
                "status": {"$ref": "#/$defs/Status", "default": "pending"},
                "child": {"$ref": "#/$defs/Task"},
            }, "required": ["content"]},
        },
        "properties": {
            "tasks": {"type": "array", "items": {"$ref": "#/$defs/Task"}, "description": "The tasks."},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Status"}},
            "limit": {"anyOf": [{"type": "integer", "maximum": 50}, {"type": "null"}]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "any": {},
        },
        "required": ["tasks"],
    }  # fmt: skip
    lines = signature(tool(schema)).splitlines()
    assert lines[0] == (
        'f(tasks: {content: string, status: "pending" | "done" = "pending", child?: Task}[], '
        'tags?: ("pending" | "done")[], limit?: integer | null, labels?: {[key: string]: string}, any?: any)'
    )
    assert "  tasks: The tasks." in lines
    assert "  tasks[].content: What to do." in lines
    assert "  limit: (maximum: 50)" in lines
    assert not any("Task" in line and "title" in line for line in lines)  # titles are left out


def test_a_schema_that_is_not_an_object_of_properties_is_written_as_it_is() -> None:
    schema = {"type": "object", "anyOf": [{"required": ["a"]}, {"required": ["b"]}], "properties": {"a": {}}}
    written = json.dumps(schema, separators=(",", ":"))
    assert signature(tool(schema)) == f"f(arguments)\n  Does f.\n  arguments: {written}"
    assert signature(tool(None, description=None)) == "f()"
    assert signature(tool({"type": "object", "properties": {}})) == "f()\n  Does f."


def test_every_description_and_property_of_open_webuis_tools_reaches_the_text() -> None:
    tools = [Tool.model_validate(t) for t in load("openwebui_builtin_tools")["exchanges"][0]["body"]["tools"]]
    text = signatures(tools)
    squashed = " ".join(text.split())
    for t in tools:
        assert f"{t.function.name}(" in text
        for line in (t.function.description or "").splitlines():
            assert line.strip() in text
        for name, prop in ((t.function.parameters or {}).get("properties") or {}).items():
            assert f"{name}:" in text or f"{name}?:" in text
            if prop.get("description"):
                assert " ".join(prop["description"].split()) in squashed
