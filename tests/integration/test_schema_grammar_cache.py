"""Response-format grammars are kept by schema (issue 35 item 1: a schema sent every turn is converted once)."""

from __future__ import annotations

from backends.llamacpp.worker.tools import grammar
from backends.llamacpp.worker.tools.grammar import schema_grammar


def test_the_same_schema_is_converted_once_and_property_order_still_counts() -> None:
    grammar._cached_schema_grammar.cache_clear()
    schema = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"enum": list(range(2000))}},
              "required": ["b", "a"]}  # fmt: skip
    first = schema_grammar(schema)
    again = schema_grammar({**schema})  # an equal schema from another request
    info = grammar._cached_schema_grammar.cache_info()
    assert again is first and (info.hits, info.misses) == (1, 1)
    swapped = schema_grammar({**schema, "properties": {"a": schema["properties"]["a"], "b": {"type": "string"}}})
    assert swapped != first  # the properties come out in the schema's order: a different grammar
    assert grammar._cached_schema_grammar.cache_info().misses == 2


def test_the_cache_is_bounded() -> None:
    grammar._cached_schema_grammar.cache_clear()
    for n in range(grammar.SCHEMA_CACHE_SIZE + 5):
        schema_grammar({"enum": [n]})
    assert grammar._cached_schema_grammar.cache_info().currsize == grammar.SCHEMA_CACHE_SIZE
