"""Tool calling and structured output through `voltgate serve` on the real SmolLM2, with the official openai SDK.

SmolLM2's chat template knows nothing of tools, so these exercise the generic format: tools described in the
system prompt, calls in `<tool_call>` syntax, forced calls held to a grammar built from the tool's schema.
What chat frontends send is tested as they send it: Open WebUI puts ~30 tools on every chat, no tool_choice.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from tests.e2e.conftest import MODEL, Gateway
from tests.openai_schema import assert_matches_openai

pytestmark = pytest.mark.e2e

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "City name, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER_SCHEMA},
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current local time in a timezone",
        "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


def frontend_tools(n: int = 30) -> list[dict[str, Any]]:
    """Tool definitions shaped like Open WebUI's built-in and workspace tools (name, description, schema)."""
    names = ["search_web", "fetch_url", "get_current_timestamp", "query_knowledge_bases", "view_knowledge_file",
             "search_notes", "view_note", "write_note", "generate_image", "edit_image", "execute_code",
             "search_chats", "view_chat", "get_memory", "add_memory", "update_memory", "delete_memory",
             "list_channels", "search_channel", "post_message", "calendar_events", "create_event", "send_email",
             "read_email", "translate_text", "summarize_url", "get_stock_price", "convert_units",
             "calculator", "get_weather_forecast"]  # fmt: skip
    tools = []
    for name in names[:n]:
        params = {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": f"input for {name}"},
                "limit": {"type": "integer", "description": "max results"},
            },
            "required": ["query"],
        }
        description = f"{name.replace('_', ' ').capitalize()}."
        tools.append({"type": "function", "function": {"name": name, "description": description, "parameters": params}})
    return tools


def test_required_tool_choice_returns_a_well_formed_call(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER, TIME], tool_choice="required", temperature=0, max_tokens=256
    )
    assert_matches_openai("CreateChatCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert calls and all(c.id.startswith("call_") and c.type == "function" for c in calls)
    assert calls[0].function.name in ("get_weather", "get_time")
    schema = WEATHER_SCHEMA if calls[0].function.name == "get_weather" else TIME["function"]["parameters"]
    jsonschema.validate(json.loads(calls[0].function.arguments), schema)


def test_a_named_tool_choice_calls_that_tool_with_valid_arguments(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(
        model=MODEL, messages=ASK, tools=[TIME, WEATHER], temperature=0, max_tokens=256,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    calls = completion.choices[0].message.tool_calls or []
    assert calls and {c.function.name for c in calls} == {"get_weather"}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


def test_a_full_tool_loop_ends_in_a_text_answer(gateway: Gateway) -> None:
    client = gateway.client()
    first = client.chat.completions.create(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=256
    )
    call = (first.choices[0].message.tool_calls or [])[0]
    history: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21, "unit": "celsius"})},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=history, tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=48
    )
    assert_matches_openai("CreateChatCompletionResponse", final.model_dump(mode="json", exclude_unset=True))
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.tool_calls is None
    assert (final.choices[0].message.content or "").strip()


def test_streamed_tool_calls_are_accumulated_by_the_sdk_stream_helper(gateway: Gateway) -> None:
    with gateway.client().chat.completions.stream(
        model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=256
    ) as stream:
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    for chunk in chunks:
        assert_matches_openai("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
    parts = [p for c in chunks if c.choices for p in c.choices[0].delta.tool_calls or []]
    for index in {p.index for p in parts}:
        mine = [p for p in parts if p.index == index]
        assert mine[0].id and mine[0].type == "function" and mine[0].function and mine[0].function.name == "get_weather"
        assert all(p.id is None and p.function and p.function.name is None for p in mine[1:])  # argument fragments
        assert len(mine) > 1
    calls = final.choices[0].message.tool_calls or []
    assert final.choices[0].finish_reason == "tool_calls"
    assert calls and {c.function.name for c in calls} == {"get_weather"}
    assert len({c.id for c in calls}) == len(calls)
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_SCHEMA)


@pytest.mark.parametrize("stream", [True, False])
def test_what_open_webui_sends_thirty_tools_no_tool_choice_is_answered(gateway: Gateway, stream: bool) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hi! How are you today?"},
        ],
        "tools": frontend_tools(30),
        "max_tokens": 48,
        "stream": stream,
    }
    client = gateway.client()
    if not stream:
        completion = client.chat.completions.create(**body)
        assert_matches_openai("CreateChatCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
        message = completion.choices[0].message
        assert message.content or message.tool_calls
        return
    chunks = list(client.chat.completions.create(**body, stream_options={"include_usage": True}))
    for chunk in chunks:
        assert_matches_openai("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons and reasons[0] in ("stop", "length", "tool_calls")
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 300  # the tools reached the prompt


def test_tool_choice_none_never_calls(gateway: Gateway) -> None:
    for seed in range(3):
        completion = gateway.client().chat.completions.create(
            model=MODEL, messages=ASK, tools=[WEATHER], tool_choice="none", temperature=0.8, seed=seed, max_tokens=48
        )
        assert completion.choices[0].message.tool_calls is None
        assert completion.choices[0].finish_reason in ("stop", "length")


def test_json_schema_output_validates(gateway: Gateway) -> None:
    schema = {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": False,
    }
    for stream in (False, True):
        kwargs: dict[str, Any] = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Describe a person called Ada, 36, as JSON."}],
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": schema, "strict": True},
            },
            "temperature": 0,
            "max_tokens": 96,
        }
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in gateway.client().chat.completions.create(
                **kwargs, stream=True) if c.choices)  # fmt: skip
        else:
            text = gateway.client().chat.completions.create(**kwargs).choices[0].message.content or ""
        jsonschema.validate(json.loads(text), schema)


def test_sdk_parse_helper_with_a_pydantic_model(gateway: Gateway) -> None:
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    parsed = gateway.client().beta.chat.completions.parse(
        model=MODEL, messages=[{"role": "user", "content": "Name a city in France."}], response_format=City,
        temperature=0, max_tokens=400,
    )  # fmt: skip
    city = parsed.choices[0].message.parsed
    assert isinstance(city, City) and city.name


def test_langchain_bind_tools_gets_a_tool_call(gateway: Gateway) -> None:
    import langchain_openai

    def get_weather(city: str, unit: str) -> str:
        """Current weather in a city (unit: celsius or fahrenheit)."""
        return f"21 {unit} in {city}"

    llm = langchain_openai.ChatOpenAI(
        model=MODEL, base_url=gateway.base_url, api_key="unused", temperature=0, max_tokens=256, max_retries=0
    )
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Paris?")
    assert message.tool_calls and {c["name"] for c in message.tool_calls} == {"get_weather"}
    assert all(set(c["args"]) == {"city", "unit"} for c in message.tool_calls)
