"""Tools as compact signatures, for templates without a tool format of their own (the generic format).

A tool's JSON schema written out as JSON costs a small model's context dearly: Open WebUI's 36 built-in tools
are ~7,000 SmolLM2 tokens as one JSON object per line, over half of it braces, quotes and the schema's
keywords. Here each tool is one signature line in a TypeScript-like notation, its description and its
parameters' descriptions under it::

    get_weather(city: string, unit?: "celsius" | "fahrenheit", days: integer = 1)
      Current weather in a city.
      city: City name, e.g. Paris
      days: (minimum: 1)

Nothing the model needs is dropped: every property (nested ones too, named by their path: `tasks[].status`),
whether it is required (`?` marks an optional one, `= value` its default), its type (enums as unions of
literals, arrays as `T[]`, `$ref`s resolved), its description and every other keyword (`minimum`, `format`,
`pattern`, ...: "notes" after its description). Only `title`s (pydantic's repeat the property's name) and
`additionalProperties` (a call is held to the schema by the grammar anyway) are left out. What the model
writes is unchanged: a `<tool_call>` JSON block, held to the full schema by the grammar once it opens.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.request import Tool

Schema = Mapping[str, Any]

_SCALARS = frozenset({"string", "number", "integer", "boolean", "null"})
_STRUCTURE = frozenset(
    {"type", "properties", "required", "items", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "$defs",
     "definitions", "additionalProperties", "default", "description"}
)  # fmt: skip
_DROPPED = frozenset({"title", "$schema", "$id", "$comment"})
_MAX_DEPTH = 8  # deeper than this (or a recursive $ref): the definition's name, or compact JSON


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@dataclass
class _Render:
    """One tool's rendering: the definitions `$ref`s point into, and the description lines gathered."""

    defs: Mapping[str, Any]
    lines: list[str] = field(default_factory=list)
    expanding: list[str] = field(default_factory=list)

    def describe(self, path: str, schema: Schema) -> None:
        """A line for `path` if its schema says more than its type: a description or other keywords."""
        text = " ".join(str(schema.get("description") or "").split("\n")).strip()
        notes = {k: v for k, v in schema.items() if k not in _STRUCTURE and k not in _DROPPED}
        if notes:
            text = (text + " " if text else "") + "(" + ", ".join(f"{k}: {_json(v)}" for k, v in notes.items()) + ")"
        if text:
            self.lines.append(f"  {path}: {text}")

    def type_text(self, schema: Any, path: str, depth: int = 0) -> str:
        """`schema` as a type (`string`, `"a" | "b"`, `{x: integer}[]`), describing nested properties."""
        if not isinstance(schema, Mapping):
            return "any" if schema is True or schema is None else _json(schema)
        if depth > _MAX_DEPTH:
            return _json(schema)
        if "$ref" in schema:
            return self._ref(schema, path, depth)
        for key, joiner in (("anyOf", " | "), ("oneOf", " | "), ("allOf", " & ")):
            if isinstance(schema.get(key), list) and schema[key]:
                return joiner.join(self._grouped(s, path, depth + 1) for s in schema[key])
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return " | ".join(_json(v) for v in schema["enum"])
        if "const" in schema:
            return _json(schema["const"])
        kind = schema.get("type")
        if isinstance(kind, list) and kind:
            return " | ".join(self.type_text({**schema, "type": k}, path, depth + 1) for k in kind)
        if kind == "array" or "items" in schema:
            items = schema.get("items")
            return "array" if items is None else self._grouped(items, f"{path}[]", depth + 1) + "[]"
        if kind == "object" or "properties" in schema:
            return self._object(schema, path, depth)
        return kind if isinstance(kind, str) and kind in _SCALARS else "any"

    def _grouped(self, schema: Any, path: str, depth: int) -> str:
        """A member of a union or an array's items, parenthesised where it is itself a union."""
        text = self.type_text(schema, path, depth)
        if isinstance(schema, Mapping):
            self.describe(path, schema)
        return f"({text})" if isinstance(schema, Mapping) and _is_union(self._resolved(schema)) else text

    def _resolved(self, schema: Schema) -> Schema:
        """The definition a `$ref` names (one level), else `schema` itself."""
        target = self.defs.get(str(schema.get("$ref", "")).rsplit("/", 1)[-1]) if "$ref" in schema else None
        return target if isinstance(target, Mapping) else schema

    def _ref(self, schema: Schema, path: str, depth: int) -> str:
        ref = str(schema["$ref"])
        name = ref.rsplit("/", 1)[-1]
        target = self.defs.get(name) if ref.startswith(("#/$defs/", "#/definitions/")) else None
        if not isinstance(target, Mapping) or name in self.expanding:
            return name
        self.expanding.append(name)
        try:
            return self.type_text(target, path, depth + 1)
        finally:
            self.expanding.pop()

    def _object(self, schema: Schema, path: str, depth: int) -> str:
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        if not isinstance(properties, Mapping) or not properties:
            if isinstance(extra, Mapping):
                return "{[key: string]: " + self.type_text(extra, f"{path}.*", depth + 1) + "}"
            return "object"
        return "{" + self.members(schema, f"{path}.", depth + 1) + "}"

    def members(self, schema: Schema, prefix: str, depth: int) -> str:
        """`a: string, b?: integer = 3`: an object's properties, each described under the signature."""
        required = set(schema.get("required") or ())
        parts = []
        for name, sub in (schema.get("properties") or {}).items():
            path = prefix + name
            sub = sub if isinstance(sub, Mapping) else {}
            self.describe(path, sub)
            text = self.type_text(sub, path, depth)
            if name in required:
                parts.append(f"{name}: {text}")
            elif "default" in sub:
                parts.append(f"{name}: {text} = {_json(sub['default'])}")
            else:
                parts.append(f"{name}?: {text}")
        return ", ".join(parts)


def _is_union(schema: Schema) -> bool:
    """Whether `schema`'s type is written with `|` or `&` at its top (so `T[]` needs parentheses)."""
    members = [schema.get(k) for k in ("anyOf", "oneOf", "allOf", "enum")]
    kind = schema.get("type")
    return any(isinstance(m, list) and len(m) > 1 for m in members) or (isinstance(kind, list) and len(kind) > 1)


def signature(tool: Tool) -> str:
    """One tool as its signature line, its description and its parameters' descriptions."""
    function = tool.function
    parameters: Schema = function.parameters or {}
    defs = {**(parameters.get("definitions") or {}), **(parameters.get("$defs") or {})}
    render = _Render(defs)
    top_level = set(parameters) - _DROPPED - {"type", "properties", "required", "additionalProperties", "$defs",
                                                "definitions"}  # fmt: skip
    if top_level or parameters.get("type", "object") != "object":
        # Not a plain object of named properties: the schema as it is (rare; the grammar holds calls to it).
        head, lines = f"{function.name}(arguments)", [f"  arguments: {_json(parameters)}"]
    else:
        head = f"{function.name}({render.members(parameters, '', 1)})"
        lines = render.lines
    description = ["  " + line.strip() for line in (function.description or "").splitlines() if line.strip()]
    return "\n".join([head, *description, *lines])


def signatures(tools: Sequence[Tool]) -> str:
    """Every tool's `signature`, one block each."""
    return "\n".join(signature(tool) for tool in tools)
