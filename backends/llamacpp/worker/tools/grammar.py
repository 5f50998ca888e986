"""GBNF grammars: tool calls in each family's syntax with arguments held to their JSON schema, and JSON
schemas themselves (`response_format: json_schema`).

Schemas are converted by llama-cpp-python's `SchemaConverter` (a port of llama.cpp's
json-schema-to-grammar). Tool `i`'s argument rules are all named `t{i}-args...` and its `$defs` are renamed
`t{i}-...`, so tools never share rules by accident; the call syntax around them uses `tc-` rules.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Sequence
from typing import Any

from llama_cpp import llama_grammar as _llama_grammar

from backends.request import Tool

# The converter module is untyped; keep every use of it here.
_converter_module: Any = _llama_grammar

NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
"""The arguments schema of a tool that declares no `parameters` (OpenAI: the function takes none)."""

_CONVERSION_ERRORS = (AssertionError, KeyError, TypeError, ValueError, AttributeError, RecursionError)


class SchemaGrammarError(Exception):
    """A JSON schema the converter cannot express (an unknown keyword or type, a remote `$ref`, ...)."""


_LAX_CHAR = _converter_module.PRIMITIVE_RULES["char"].content
_JSON_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
"""A character of a JSON string, as llama.cpp's own json-schema-to-grammar has it: no raw control character.
llama-cpp-python's port allows any but `"` and `\\`, so a model could write a raw newline inside a string:
no JSON, and a forced tool call that no parser can read (issue 26)."""


def _new_converter() -> Any:
    return _converter_module.SchemaConverter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)


def _format(converter: Any) -> str:
    """The converter's grammar, its string characters held to JSON's rule (`_JSON_CHAR`)."""
    rules: dict[str, str] = converter._rules
    for name, rule in rules.items():
        if rule == _LAX_CHAR:
            rules[name] = _JSON_CHAR
    return str(converter.format_grammar())


def _visit(converter: Any, schema: dict[str, Any], name: str) -> str:
    resolved = converter.resolve_refs(copy.deepcopy(schema), name or "schema")
    return str(converter.visit(resolved, name))


SCHEMA_CACHE_SIZE = 32
"""Response-format grammars kept by schema: a client sends the same schema every turn, and a large one (a
20,000-value enum) takes seconds to convert."""


def schema_grammar(schema: dict[str, Any]) -> str:
    """A grammar (root rule `root`) for JSON text that conforms to `schema`; the last `SCHEMA_CACHE_SIZE`
    schemas' grammars are kept, keyed by the schema's compact JSON (its key order kept: an object's properties
    come out in the order the schema lists them)."""
    return _cached_schema_grammar(json.dumps(schema, ensure_ascii=False, separators=(",", ":")))


@functools.lru_cache(maxsize=SCHEMA_CACHE_SIZE)
def _cached_schema_grammar(canonical: str) -> str:
    schema = json.loads(canonical)
    converter = _new_converter()
    try:
        _visit(converter, schema, "")
    except _CONVERSION_ERRORS as exc:
        raise SchemaGrammarError(f"the JSON schema cannot be enforced: {exc or type(exc).__name__}") from exc
    return _format(converter)


def literal(text: str) -> str:
    """`text` as a GBNF string literal."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r")
    return '"' + escaped.replace("\t", "\\t") + '"'


def _json_literal(value: str) -> str:
    """A GBNF literal matching `value` written as a JSON string (quotes included)."""
    return literal(json.dumps(value, ensure_ascii=False))


def _prefix_definitions(node: Any, prefix: str) -> Any:
    """A copy of a schema whose local `$defs`/`definitions` names (and `$ref`s to them) carry `prefix`."""
    if isinstance(node, list):
        return [_prefix_definitions(item, prefix) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("$defs", "definitions") and isinstance(value, dict):
            out[key] = {prefix + name: _prefix_definitions(v, prefix) for name, v in value.items()}
        elif key == "$ref" and isinstance(value, str) and value.startswith(("#/$defs/", "#/definitions/")):
            head, _, name = value.rpartition("/")
            out[key] = f"{head}/{prefix}{name}"
        else:
            out[key] = _prefix_definitions(value, prefix)
    return out


class ToolRules:
    """The argument rules of a request's tools, in one converter: `self.names[i]` is tool i's root rule.

    A tool whose schema the converter cannot express gets "any JSON object" instead of failing the
    request: the call stays well-formed, only its arguments go unchecked.
    """

    def __init__(self, tools: Sequence[Tool]) -> None:
        self._converter = _new_converter()
        self.names = [self._add(i, tool) for i, tool in enumerate(tools)]

    def _add(self, i: int, tool: Tool) -> str:
        schema = _prefix_definitions(tool.function.parameters or NO_PARAMETERS, f"t{i}-")
        name = f"t{i}-args"
        try:  # a throwaway converter first: a failed visit can leave rules that point at missing ones
            _visit(_new_converter(), schema, name)
        except _CONVERSION_ERRORS:
            schema = {"type": "object"}
        return _visit(self._converter, schema, name)

    def text(self) -> str:
        return _format(self._converter)


def _call_object(name: str, key: str, arguments_rule: str) -> str:
    """`{"name": "<name>", "<key>": <arguments>}` with the converter's whitespace rule."""
    return (
        f'"{{" space {_json_literal("name")} space ":" space {_json_literal(name)} space "," space '
        f'{_json_literal(key)} space ":" space {arguments_rule} "}}" space'
    )


def _object_calls(tools: Sequence[Tool], key: str) -> tuple[ToolRules, list[str]]:
    rules = ToolRules(tools)
    lines = [
        f"tc-call-{i} ::= {_call_object(tool.function.name, key, rule)}"
        for i, (tool, rule) in enumerate(zip(tools, rules.names, strict=True))
    ]
    alternatives = " | ".join(f"tc-call-{i}" for i in range(len(tools)))
    return rules, [*lines, f"tc-object ::= {alternatives}"]


def hermes_grammar(tools: Sequence[Tool], *, parallel: bool) -> str:
    """`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, once or (parallel) repeated."""
    rules, lines = _object_calls(tools, "arguments")
    lines.append('tc-call ::= "<tool_call>\\n" tc-object "\\n</tool_call>"')
    lines.append("root ::= tc-call" + (' ( "\\n" tc-call )*' if parallel else ""))
    return "\n".join([rules.text(), *lines]) + "\n"


def llama3_grammar(tools: Sequence[Tool]) -> str:
    """`{"name": ..., "parameters": {...}}`: Llama 3 templates take one call per assistant turn."""
    rules, lines = _object_calls(tools, "parameters")
    lines.append("root ::= tc-object")
    return "\n".join([rules.text(), *lines]) + "\n"


def mistral_list_grammar(tools: Sequence[Tool], *, parallel: bool) -> str:
    """`[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (v3 tokenizers)."""
    rules, lines = _object_calls(tools, "arguments")
    more = ' ( "," space tc-object )*' if parallel else ""
    lines.append(f'root ::= "[TOOL_CALLS]" "[" tc-object{more} "]"')
    return "\n".join([rules.text(), *lines]) + "\n"


def mistral_named_grammar(tools: Sequence[Tool], *, parallel: bool) -> str:
    """`[TOOL_CALLS]name[ARGS]{...}`, once or (parallel) repeated (v11+ tokenizers)."""
    rules = ToolRules(tools)
    alternatives = " | ".join(
        f'{literal(tool.function.name)} "[ARGS]" {rule}' for tool, rule in zip(tools, rules.names, strict=True)
    )
    lines = [f'tc-call ::= "[TOOL_CALLS]" ( {alternatives} )', "root ::= tc-call" + ("+" if parallel else "")]
    return "\n".join([rules.text(), *lines]) + "\n"


def harmony_grammar(tools: Sequence[Tool]) -> str:
    """A gpt-oss call message after `<|start|>assistant`: the recipient in the role part
    (` to=functions.NAME<|channel|>commentary json<|message|>{...}`) or in the channel part
    (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`). One call: `<|call|>`
    ends the turn (an end-of-generation token, which the finished grammar leaves the model free to write)."""
    rules = ToolRules(tools)
    kind = '( " "? "<|constrain|>"? "json" )? "<|message|>"'
    lines = []
    for i, (tool, rule) in enumerate(zip(tools, rules.names, strict=True)):
        name = literal(tool.function.name)
        lines.append(f'tc-in-role-{i} ::= {name} "<|channel|>commentary" {kind} {rule}')
        lines.append(f"tc-in-channel-{i} ::= {name} {kind} {rule}")
    in_role = " | ".join(f"tc-in-role-{i}" for i in range(len(tools)))
    in_channel = " | ".join(f"tc-in-channel-{i}" for i in range(len(tools)))
    lines.append(f'root ::= " to=functions." ( {in_role} ) | "<|channel|>commentary to=functions." ( {in_channel} )')
    return "\n".join([rules.text(), *lines]) + "\n"
