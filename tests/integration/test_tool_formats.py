"""Tool-call formats: picked from real chat templates, parsed from outputs in each family's own syntax, and
conversations with tools, calls and results rendered through each real template."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backends.llamacpp.worker.text import CHATML_TEMPLATE, ChatTemplate, ChatTemplateError
from backends.llamacpp.worker.tools import ParsedCall, ParsedOutput, ToolFormat, new_call_id, select_format
from backends.llamacpp.worker.tools.formats import GENERIC, HARMONY, HERMES, LLAMA3, MISTRAL, MISTRAL_V11
from backends.llamacpp.worker.tools.messages import short_call_id
from backends.request import EngineMessage, FunctionCall, FunctionDefinition, Tool, ToolCall
from tests.fixtures.gguf_templates import template_families, template_text


def tool(name: str, parameters: dict[str, Any] | None, description: str | None = None) -> Tool:
    return Tool(function=FunctionDefinition(name=name, description=description, parameters=parameters))


WEATHER = tool(
    "get_weather",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
    "Current weather in a city",
)
SEARCH = tool(
    "search_web",
    {
        "type": "object",
        "properties": {"query": {"type": "string"}, "max_results": {"type": "integer"}},
        "required": ["query"],
    },
    "Search the web",
)
CLOCK = tool("get_time", None)
BRAVE = tool("brave_search", {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]})
TOOLS = (WEATHER, SEARCH, CLOCK, BRAVE)
NAMES = [t.function.name for t in TOOLS]

FORMAT_OF_FIXTURE = {
    "qwen2_5": HERMES,
    "hermes3": HERMES,
    "llama3_2": LLAMA3,
    "llama3_3": LLAMA3,
    "mistral_nemo": MISTRAL,
    "mistral_small_3_2": MISTRAL_V11,
    "smollm2": GENERIC,
    "gemma2": GENERIC,
    # the reasoning families' templates (docs/reasoning-worker.md): Qwen3 writes Hermes calls; DeepSeek's own
    # call syntax has no parser here, so its tools are generic; gpt-oss's harmony has its own
    "qwen3": HERMES,
    "deepseek_r1_distill": GENERIC,
    "gpt_oss": HARMONY,
}


H_CHANNEL = "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
H_ROLE = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"


def call(name: str, **arguments: Any) -> ParsedCall:
    return ParsedCall(name, json.dumps(arguments, separators=(",", ":"), ensure_ascii=False))


PARIS = call("get_weather", city="Paris", unit="celsius")
QUERY = call("search_web", query="llama.cpp tool calling", max_results=3)

# (format, model output, expected content, expected calls). Outputs are written the way each family's
# models write them; the expected calls are None where the output must come back as plain text.
SAMPLES: list[tuple[ToolFormat, str, str | None, list[ParsedCall] | None]] = [
    # Qwen2.5: newline-wrapped JSON, one block per call
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        None,
        [PARIS],
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "search_web", "arguments": {"query": "llama.cpp tool calling", "max_results": 3}}\n'
        "</tool_call>",
        None,
        [PARIS, QUERY],
    ),
    # Hermes 3: text first, keys in any order, pretty-printed JSON, several calls
    (
        HERMES,
        'I\'ll look both up.\n<tool_call>\n{"arguments": {"city": "Paris", "unit": "celsius"}, '
        '"name": "get_weather"}\n</tool_call>\n<tool_call>\n{\n  "name": "search_web",\n  "arguments": {\n'
        '    "query": "llama.cpp tool calling",\n    "max_results": 3\n  }\n}\n</tool_call>',
        "I'll look both up.",
        [PARIS, QUERY],
    ),
    (HERMES, '<tool_call>{"name": "get_time"}</tool_call>', None, [call("get_time")]),
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Z\\u00fcrich\\"}"}\n</tool_call>',
        None,
        [call("get_weather", city="Zürich")],
    ),
    (
        HERMES,
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n',
        None,
        [PARIS],
    ),  # the end of the output forgives a missing closing tag when the JSON is whole
    (HERMES, "It is sunny in Paris today.", "It is sunny in Paris today.", []),
    (HERMES, 'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par', None, None),  # truncated
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>', None, None),
    (HERMES, '<tool_call>\n{"name": "delete_files", "arguments": {"path": "/"}}\n</tool_call>', None, None),
    (HERMES, "Use <tool_call> tags to call tools.", None, None),
    (HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}} trailing\n</tool_call>', None, None),
    # Llama 3.1 / 3.2 / 3.3: the reply is the JSON, with "parameters"
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None, [PARIS]),
    (
        LLAMA3,
        '\n\n{"type": "function", "name": "search_web", "parameters": {"query": "llama.cpp tool calling", '
        '"max_results": 3}}',
        None,
        [QUERY],
    ),
    (
        LLAMA3,
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        None,
        [PARIS],
    ),
    (
        LLAMA3,
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        None,
        [call("brave_search", query="weather in Paris")],
    ),
    (LLAMA3, '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}', None, [PARIS]),
    (
        LLAMA3,
        '{"name": "get_time", "parameters": {}}\n\nLet me check the time.',
        "Let me check the time.",
        [call("get_time")],
    ),
    (LLAMA3, 'The call would be {"name": "get_weather", "parameters": {"city": "Paris"}}', None, None),  # not at start
    (LLAMA3, '{"answer": 42}', None, None),
    (LLAMA3, '{"name": "get_weather", "parameters": {"city": "Par', None, None),
    (LLAMA3, '<|python_tag|>brave_search.call(query="weather in Par', None, None),
    (LLAMA3, '{"name": "unknown_tool", "parameters": {}}', None, None),
    # Mistral v3 tokenizers (7B v0.3, Nemo): one JSON list after [TOOL_CALLS]
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        None,
        [PARIS],
    ),
    (
        MISTRAL,
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, '
        '"id": "a1B2c3D4e"}, {"name": "search_web", "arguments": {"query": "llama.cpp tool calling", '
        '"max_results": 3}, "id": "f5G6h7I8j"}]',
        None,
        [PARIS, QUERY],
    ),
    (MISTRAL, 'Let me check.[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', "Let me check.", [call("get_time")]),
    (MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "search', None, None),
    (
        MISTRAL,
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "nope", "arguments": {}}]',
        None,
        None,
    ),
    # Mistral v11+ tokenizers (Small 3.2, Devstral, Magistral): [TOOL_CALLS]name[ARGS]{...} per call
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}', None, [PARIS]),
    (
        MISTRAL_V11,
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}[TOOL_CALLS]search_web[ARGS]'
        '{"query": "llama.cpp tool calling", "max_results": 3}',
        None,
        [PARIS, QUERY],
    ),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris", "unit": "celsius"}', None, [PARIS]),
    (MISTRAL_V11, "I will check.[TOOL_CALLS]get_time[ARGS]{}", "I will check.", [call("get_time")]),
    (MISTRAL_V11, "[TOOL_CALLS]get_weather[AR", None, None),
    (MISTRAL_V11, '[TOOL_CALLS]get_weather{"city": "Paris"}', None, None),
    # gpt-oss (harmony), as the reasoning parser hands the answer over: a call message whole, from
    # <|start|>assistant; the recipient in the channel part or in the role part
    (HARMONY, f"{H_CHANNEL}{{\"city\": \"Paris\", \"unit\": \"celsius\"}}<|call|>", None, [PARIS]),
    (HARMONY, f"{H_ROLE}{{\"city\": \"Paris\", \"unit\": \"celsius\"}}", None, [PARIS]),  # <|call|>: end of generation
    (HARMONY, "<|start|>assistant<|channel|>commentary to=functions.get_time<|message|>{}<|end|>", None,
     [call("get_time")]),
    (HARMONY, "<|start|>assistant<|channel|>analysis to=functions.get_time <|constrain|>json<|message|>{}", None,
     [call("get_time")]),  # llama.cpp reads a call on the analysis channel too
    (
        HARMONY,
        f"Checking both.{H_CHANNEL}{{\"city\": \"Paris\", \"unit\": \"celsius\"}}<|call|>"
        '<|start|>assistant to=functions.search_web<|channel|>commentary json<|message|>'
        '{"query": "llama.cpp tool calling", "max_results": 3}<|call|>',
        "Checking both.",
        [PARIS, QUERY],
    ),
    (HARMONY, f'{H_CHANNEL}{{"city": "Paris"', None, None),  # cut short
    (HARMONY, f"{H_CHANNEL}city=Paris<|call|>", None, None),  # no JSON
    (HARMONY, f'{H_CHANNEL}{{"city": "Paris"}} and more', None, None),
    (HARMONY, '<|start|>assistant<|channel|>commentary to=functions.nope<|message|>{}<|call|>', None, None),
    (HARMONY, '<|start|>assistant<|channel|>commentary to=browser.search<|message|>{}<|call|>', None, None),
    (HARMONY, "<|start|>assistant<|channel|>commentary to=functions.get_time", None, None),  # no body
    # generic: the Hermes syntax our system prompt teaches
    (
        GENERIC,
        'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>',
        "Sure.",
        [PARIS],
    ),
]


def expected(text: str, content: str | None, calls: list[ParsedCall] | None) -> ParsedOutput:
    if calls is None:  # malformed, truncated or unknown: the whole text is for the user
        return ParsedOutput(text.strip() or None, [])
    return ParsedOutput(content, calls)


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), SAMPLES)
def test_parse_reads_each_family_output(fmt: ToolFormat, text: str, content: str | None, calls: Any) -> None:
    parsed = fmt.parse(text, NAMES)
    assert parsed == expected(text, content, calls)
    for parsed_call in parsed.calls:
        assert isinstance(json.loads(parsed_call.arguments), dict)


def test_the_mistral_parser_reads_both_forms_whatever_the_template() -> None:
    assert MISTRAL.parse("[TOOL_CALLS]get_time[ARGS]{}", NAMES).calls == [call("get_time")]
    assert MISTRAL_V11.parse('[TOOL_CALLS][{"name": "get_time", "arguments": {}}]', NAMES).calls == [call("get_time")]


def test_a_call_of_a_tool_not_offered_is_text() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert HERMES.parse(text, ["search_web"]) == ParsedOutput(text, [])


@pytest.mark.parametrize("family", template_families())
def test_each_real_template_selects_its_family_format(family: str) -> None:
    assert select_format(template_text(family)) is FORMAT_OF_FIXTURE[family]


@pytest.mark.parametrize(
    ("source", "fmt"),
    [
        (None, GENERIC),
        ("", GENERIC),
        (CHATML_TEMPLATE, GENERIC),
        ("{{ '<tool_call>\\n<function=' + name + '>' }}", GENERIC),  # Qwen3-Coder's XML calls: not ours
        ("{% for m in messages %}{{ m.content }}{% endfor %}", GENERIC),
    ],
)
def test_templates_without_a_known_tool_syntax_are_generic(source: str | None, fmt: ToolFormat) -> None:
    assert select_format(source) is fmt
    assert not GENERIC.native and HERMES.native and LLAMA3.native and MISTRAL.native


def test_call_ids_are_openai_shaped_and_fresh() -> None:
    ids = {new_call_id() for _ in range(100)}
    assert len(ids) == 100
    for call_id in ids:
        assert call_id.startswith("call_") and len(call_id) == 29 and call_id[5:].isalnum()


def test_mistral_ids_are_nine_alphanumerics_and_stable() -> None:
    long_id = new_call_id()
    assert short_call_id(long_id) == short_call_id(long_id)
    assert len(short_call_id(long_id)) == 9 and short_call_id(long_id).isalnum()
    assert short_call_id("a1B2c3D4e") == "a1B2c3D4e"
    assert short_call_id("call_1") != short_call_id("call_2")


# --- messages for templates, and the real templates rendering them ------------------------------------------


def conversation(*, parallel: bool) -> list[EngineMessage]:
    calls = [ToolCall(id="call_weather", function=FunctionCall(name="get_weather", arguments='{"city": "Paris"}'))]
    results = [EngineMessage(role="tool", content='{"temperature": 21}', tool_call_id="call_weather")]
    if parallel:
        calls.append(ToolCall(id="call_search", function=FunctionCall(name="search_web", arguments='{"query": "x"}')))
        results.append(EngineMessage(role="tool", content="no results", tool_call_id="call_search"))
    return [
        EngineMessage(role="system", content="You are a helpful assistant."),
        EngineMessage(role="user", content="What is the weather in Paris?"),
        EngineMessage(role="assistant", content=None, tool_calls=tuple(calls)),
        *results,
    ]


def render(family: str, messages: list[EngineMessage], tools: tuple[Tool, ...] = TOOLS) -> str:
    fmt = select_format(template_text(family))
    template = ChatTemplate(template_text(family), bos_token="<s>", eos_token="</s>")
    prepared = fmt.prepare_messages(messages, tools, system_role=template.supports_system_role)
    return template.render(prepared, fmt.tools_for_template(tools) if fmt.native else None)


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("family", template_families())
def test_every_real_template_renders_tools_calls_and_results(family: str, parallel: bool) -> None:
    prompt = render(family, conversation(parallel=parallel))
    for name in NAMES:
        assert name in prompt
    assert "Paris" in prompt and "21" in prompt
    assert "&#34;" not in prompt  # transformers' tojson: plain JSON, never HTML-escaped Markup
    if parallel:
        assert "no results" in prompt


@pytest.mark.parametrize("family", template_families())
def test_every_real_template_renders_a_plain_chat_without_tools(family: str) -> None:
    messages = [EngineMessage(role="user", content="Hello there")]
    assert "Hello there" in render(family, messages, tools=())


def test_template_messages_carry_parsed_arguments_and_tool_names() -> None:
    prepared = HERMES.prepare_messages(conversation(parallel=False), TOOLS)
    assert "tool_calls" not in prepared[1]  # templates test for the key itself
    assert prepared[2]["tool_calls"] == [
        {"id": "call_weather", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert prepared[2]["content"] == ""
    assert prepared[3] == {
        "role": "tool",
        "content": '{"temperature": 21}',
        "tool_call_id": "call_weather",
        "name": "get_weather",
    }


def test_llama3_messages_have_one_call_per_assistant_turn() -> None:
    prepared = LLAMA3.prepare_messages(conversation(parallel=True), TOOLS)
    assistant = [m for m in prepared if m["role"] == "assistant"]
    assert [len(m["tool_calls"]) for m in assistant] == [1, 1]


def test_harmony_renders_each_call_of_a_turn_followed_by_its_own_result() -> None:
    """gpt-oss's template renders a turn's first call only and names a result after the call before it."""
    history = conversation(parallel=True)
    history[3:5] = [history[4], history[3]]  # results in another order than the calls
    prompt = render("gpt_oss", history)
    weather = "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    search = "<|start|>assistant to=functions.search_web<|channel|>commentary json<|message|>"
    assert prompt.index(weather) < prompt.index("<|start|>functions.get_weather to=assistant") < prompt.index(search)
    result = '<|start|>functions.search_web to=assistant<|channel|>commentary<|message|>"no results"'
    assert prompt.index(search) < prompt.index(result)


def test_harmony_joins_a_call_turns_text_to_its_thinking() -> None:
    """The template refuses a call turn with both text and thinking: the client echoing our reply back."""
    call = ToolCall(id="call_1", function=FunctionCall(name="get_time", arguments="{}"))
    history = [
        EngineMessage(role="user", content="Time?"),
        EngineMessage(role="assistant", content="Checking.", reasoning_content="Need the clock.", tool_calls=(call,)),
        EngineMessage(role="tool", content="12:00", tool_call_id="call_1"),
    ]
    prompt = render("gpt_oss", history)
    assert "<|channel|>analysis<|message|>Need the clock.\n\nChecking.<|end|>" in prompt
    assert prompt.endswith("<|start|>assistant")


def test_mistral_messages_map_call_ids_consistently() -> None:
    prepared = MISTRAL.prepare_messages(conversation(parallel=True), TOOLS)
    ids = [c["id"] for c in prepared[2]["tool_calls"]]
    assert ids == [m["tool_call_id"] for m in prepared[3:]]
    assert all(len(i) == 9 and i.isalnum() for i in ids)


def test_generic_messages_describe_tools_and_write_calls_and_results_as_text() -> None:
    prepared = GENERIC.prepare_messages(conversation(parallel=True), TOOLS)
    assert [m["role"] for m in prepared] == ["system", "user", "assistant", "user"]
    assert prepared[0]["content"].startswith("You are a helpful assistant.\n\n# Tools")
    for name in NAMES:
        assert f"\n{name}(" in prepared[0]["content"]  # each tool's signature line (tools/signatures.py)
    assert GENERIC.parse(prepared[2]["content"], NAMES).calls == [
        call("get_weather", city="Paris"),
        call("search_web", query="x"),
    ]
    assert prepared[3]["content"] == (
        '<tool_response>\n{"temperature": 21}\n</tool_response>\n<tool_response>\nno results\n</tool_response>'
    )


def test_generic_messages_without_a_system_message_get_one() -> None:
    prepared = GENERIC.prepare_messages([EngineMessage(role="user", content="hi")], [WEATHER])
    assert prepared[0]["role"] == "system" and "get_weather" in prepared[0]["content"]
    assert GENERIC.prepare_messages([EngineMessage(role="user", content="hi")], []) == [
        {"role": "user", "content": "hi"}
    ]


def test_without_a_system_role_the_system_text_and_tools_open_the_first_user_message() -> None:
    prepared = GENERIC.prepare_messages(conversation(parallel=False), TOOLS, system_role=False)
    assert [m["role"] for m in prepared] == ["user", "assistant", "user"]
    assert prepared[0]["content"].startswith("You are a helpful assistant.\n\n# Tools")
    assert prepared[0]["content"].endswith("\n\nWhat is the weather in Paris?")
    plain = [EngineMessage(role="system", content="Be brief."), EngineMessage(role="user", content="hi")]
    assert GENERIC.prepare_messages(plain, [], system_role=False) == [{"role": "user", "content": "Be brief.\n\nhi"}]


@pytest.mark.parametrize("family", template_families())
def test_templates_that_refuse_a_system_turn_are_recognised(family: str) -> None:
    template = ChatTemplate(template_text(family), bos_token="<s>", eos_token="</s>")
    assert template.supports_system_role == (family != "gemma2")


def test_tools_for_template_fill_description_and_parameters() -> None:
    assert HERMES.tools_for_template([CLOCK]) == [
        {
            "type": "function",
            "function": {"name": "get_time", "description": "", "parameters": {"type": "object", "properties": {}}},
        }
    ]


# --- ChatTemplate.render ------------------------------------------------------------------------------------


def test_render_of_messages_alone_still_ends_with_the_generation_prompt() -> None:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token="", eos_token="")
    assert (
        template.render([{"role": "user", "content": "hi"}])
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert template.render([{"role": "user", "content": "hi"}], add_generation_prompt=False).endswith("<|im_end|>\n")


def test_tojson_keeps_key_order_and_characters_as_transformers_does() -> None:
    template = ChatTemplate("{{ messages[0] | tojson }}", bos_token="", eos_token="")
    assert template.render([{"role": "user", "content": "<b>é</b>"}]) == '{"role": "user", "content": "<b>é</b>"}'


def test_render_passes_tools_only_when_given() -> None:
    template = ChatTemplate("{{ 'T' if tools is defined else 'F' }}", bos_token="", eos_token="")
    assert template.render([{"role": "user", "content": "x"}]) == "F"
    assert template.render([{"role": "user", "content": "x"}], []) == "T"


def test_continue_final_leaves_the_last_message_open() -> None:
    template = ChatTemplate(template_text("qwen2_5"), bos_token="", eos_token="")
    messages = [{"role": "user", "content": "Count to three"}, {"role": "assistant", "content": "One, two,"}]
    prompt = template.render(messages, continue_final=True)
    assert prompt.endswith("<|im_start|>assistant\nOne, two,")


def test_continue_final_needs_text_the_template_writes() -> None:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError):
        template.render([{"role": "assistant", "content": ""}], continue_final=True)
    upper = ChatTemplate("{{ messages[-1].content | upper }}", bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError):
        upper.render([{"role": "assistant", "content": "abc"}], continue_final=True)


def test_a_template_refusing_the_conversation_is_a_chat_template_error() -> None:
    template = ChatTemplate(template_text("mistral_nemo"), bos_token="<s>", eos_token="</s>")
    with pytest.raises(ChatTemplateError):  # roles must alternate
        template.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])
    concat = ChatTemplate("{{ 'x' + messages[0].content }}", bos_token="", eos_token="")
    with pytest.raises(ChatTemplateError):
        concat.render([{"role": "user", "content": None}])
