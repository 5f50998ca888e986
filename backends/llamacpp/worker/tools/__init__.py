"""Tool calling for any GGUF: the family's native format where the chat template knows one, else generic.

Like llama.cpp's server (`--jinja`, common/chat.cpp): the template's text picks a format; native templates
render `tools` themselves, others get a system-prompt section in the Hermes `<tool_call>` syntax (so one
parser serves both); the family's call syntax is parsed out of the generated text, in one go or while
streaming; and grammars force calls for tool_choice "required" or a named tool.

Usage in the worker, for every chat request (`tools = request.active_tools`, maybe empty: the history can
still hold calls and results that the template must see)::

    fmt = select_format(model.chat_template())                  # once per model, with its ChatTemplate
    messages = fmt.prepare_messages(request.messages, tools, system_role=template.supports_system_role)
    prompt = template.render(messages, fmt.tools_for_template(tools) if fmt.native and tools else None)

    parallel = request.parallel_tool_calls is not False
    if tools and (request.tool_choice == "required" or isinstance(request.tool_choice, NamedToolChoice)):
        sampling = replace(sampling, grammar=fmt.grammar(tools, parallel=parallel))   # force a call
    # "auto": optionally fmt.lazy_grammar(tools, parallel) with llama_sampler_init_grammar_lazy_patterns

    names = [t.function.name for t in tools]
    parsed = fmt.parse(text, names)                             # non-streaming (no tools: skip it)
    tool_calls = [{"id": new_call_id(), "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls]
    finish_reason = "tool_calls" if parsed.calls else finish_reason

    stream = ToolCallStream(fmt, names)                         # streaming: per decoded text fragment
    for piece in stream.push(fragment):  # then stream.finish()
        ...  # TextPiece -> delta.content; CallStart -> delta.tool_calls[index] with id, name and
             # arguments ""; CallArguments -> delta.tool_calls[index].function.arguments

The worker must detokenize `fmt.preserved_tokens` as text (special tokens such as `[TOOL_CALLS]` or
`<|python_tag|>` otherwise render empty) and must not let a stop string cut a call short.
Structured output: `schema_grammar(json_schema)` (raises `SchemaGrammarError`).
"""

from backends.llamacpp.worker.tools.calls import (
    CallArguments,
    CallStart,
    ParsedCall,
    ParsedOutput,
    StreamPiece,
    TextPiece,
    new_call_id,
)
from backends.llamacpp.worker.tools.formats import ToolFormat, select_format
from backends.llamacpp.worker.tools.grammar import SchemaGrammarError, schema_grammar
from backends.llamacpp.worker.tools.stream import ToolCallStream

__all__ = [
    "CallArguments",
    "CallStart",
    "ParsedCall",
    "ParsedOutput",
    "SchemaGrammarError",
    "StreamPiece",
    "TextPiece",
    "ToolCallStream",
    "ToolFormat",
    "new_call_id",
    "schema_grammar",
    "select_format",
]
