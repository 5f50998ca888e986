"""OpenAI's Responses API through `voltgate serve` on the real SmolLM2, with the official openai SDK.

Every object and stream event is checked against OpenAI's published Responses schemas. SmolLM2-135M is tiny:
temperature 0, short answers and forced tool calls keep it deterministic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, running_gateway, write_config
from tests.e2e.streams import metric, scrape
from tests.openai_schema import assert_matches_openai
from tests.responses_schema import assert_event_matches, assert_matches

pytestmark = pytest.mark.e2e

SHORT = "What is 2+2? Answer with one number."  # SmolLM2 answers "The answer is 4." and stops
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": WEATHER_SCHEMA,
}
ALICE, BOB = "vg-alice-responses-key-1f", "vg-bob-responses-key-2e"


def create_raw(client: openai.OpenAI, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """`responses.create` through the SDK, with the JSON body as sent (for the schema check)."""
    raw = client.responses.with_raw_response.create(model=MODEL, temperature=0, **kwargs)
    body = raw.http_response.json()
    assert_matches("Response", body)
    return raw.parse(), body


def sse_events(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed request's events as sent: each `event:` name must be its data's `type`."""
    events, name = [], None
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["type"] == name
                events.append(event)
    return events


def test_create_answers_a_schema_valid_response_that_can_be_retrieved(gateway: Gateway) -> None:
    client = gateway.client()
    response, body = create_raw(client, input=SHORT, max_output_tokens=64)
    assert response.id.startswith("resp_") and response.status == "completed"
    assert "4" in response.output_text
    assert response.usage is not None and response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert (response.store, response.model) == (True, MODEL)
    stored = httpx.get(f"{gateway.base_url}/responses/{response.id}", timeout=10).json()
    assert stored == body
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_stream_events_come_in_order_with_increasing_sequence_numbers(gateway: Gateway) -> None:
    client = gateway.client()
    deltas: list[str] = []
    with client.responses.stream(model=MODEL, input=SHORT, temperature=0, max_output_tokens=64) as stream:
        events = list(stream)
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    ]  # fmt: skip
    assert kinds[-4:] == [
        "response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert deltas and "".join(deltas) == final.output_text
    assert client.responses.retrieve(final.id).output_text == final.output_text  # stored before the end was sent
    body = {"model": MODEL, "input": SHORT, "temperature": 0, "max_output_tokens": 64, "stream": True}
    raw = sse_events(gateway.base_url + "/responses", body)
    for event in raw:
        assert_event_matches(event)
    assert [e["type"] for e in raw] == kinds


def test_a_second_turn_sees_the_first_through_previous_response_id(gateway: Gateway) -> None:
    client = gateway.client()
    first, _ = create_raw(client, input="My name is Zed.", max_output_tokens=24)
    second, _ = create_raw(client, input="What is my name?", previous_response_id=first.id, max_output_tokens=24)
    assert second.previous_response_id == first.id
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens >= first.usage.input_tokens + first.usage.output_tokens
    raw = httpx.get(f"{gateway.base_url}/responses/{second.id}/input_items", params={"order": "asc"}, timeout=10)
    assert_matches("ResponseItemList", raw.json())
    items = client.responses.input_items.list(second.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"), ("message", "user")]
    assert items[1].id == first.output[0].id
    assert items[0].content[0].text == "My name is Zed."  # type: ignore[union-attr]
    paged = list(client.responses.input_items.list(second.id, order="asc", limit=1))  # follows `after`
    assert [i.id for i in paged] == [i.id for i in items]
    newest_first = client.responses.input_items.list(second.id).data  # OpenAI's default order: desc
    assert [i.id for i in newest_first] == [i.id for i in reversed(items)]


def test_a_forced_function_call_then_its_output_gets_a_text_answer(gateway: Gateway) -> None:
    client = gateway.client()
    ask = "What is the weather in Paris?"
    choice = {"type": "function", "name": "get_weather"}
    called, _ = create_raw(client, input=ask, tools=[WEATHER], tool_choice=choice, max_output_tokens=64)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_SCHEMA)
    output = {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"celsius": 18})}
    answered, _ = create_raw(
        client, input=[output], previous_response_id=called.id, tools=[WEATHER], tool_choice="none",
        max_output_tokens=48,
    )  # fmt: skip
    assert [item.type for item in answered.output] == ["message"]
    assert answered.output_text.strip()
    listed = client.responses.input_items.list(answered.id, order="asc").data
    assert [i.type for i in listed] == ["message", "function_call", "function_call_output"]
    assert listed[1].call_id == listed[2].call_id == calls[0].call_id  # type: ignore[union-attr]


def test_an_unstored_response_cannot_be_retrieved_or_continued(gateway: Gateway) -> None:
    client = gateway.client()
    response, _ = create_raw(client, input=SHORT, max_output_tokens=16, store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="And?", previous_response_id=response.id, max_output_tokens=4)
    assert caught.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_a_deleted_response_is_gone(gateway: Gateway) -> None:
    client = gateway.client()
    response, _ = create_raw(client, input=SHORT, max_output_tokens=16)
    deleted = httpx.delete(f"{gateway.base_url}/responses/{response.id}", timeout=10)
    assert deleted.json() == {"id": response.id, "object": "response", "deleted": True}
    for call in (client.responses.retrieve, client.responses.delete, client.responses.input_items.list):
        with pytest.raises(openai.NotFoundError):
            call(response.id)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "code_interpreter", "container": {"type": "auto"}}]}, "tools[0].type"),
        ({"tool_choice": {"type": "web_search_preview"}, "tools": [{"type": "web_search_preview"}]}, "tool_choice"),
        ({"background": True}, "background"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "call_id": "call_nope", "output": "x"}]}, "input[0]"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    gateway: Gateway, extra: dict[str, Any], param: str
) -> None:
    response = httpx.post(gateway.base_url + "/responses", json={"model": MODEL, "input": "hi", **extra}, timeout=10)
    assert response.status_code == 400, response.text
    assert_matches_openai("ErrorResponse", response.json())
    assert response.json()["error"]["param"] == param


def test_langchain_with_the_responses_api(gateway: Gateway) -> None:
    import langchain_openai

    llm = langchain_openai.ChatOpenAI(
        model=MODEL, base_url=gateway.base_url, api_key="unused", use_responses_api=True, temperature=0,
        max_tokens=64, max_retries=0,
    )  # fmt: skip
    reply = llm.invoke(SHORT)
    assert "4" in reply.text
    assert reply.response_metadata["id"].startswith("resp_")


@pytest.fixture
def persistent(smollm2_path: Path, tmp_path: Path) -> Path:
    """A config with a data directory of its own, for gateways started one after another on it."""
    return write_config(tmp_path, smollm2_path, free_port(), data_dir=str(tmp_path / "data"))


def test_a_stored_response_survives_a_restart_and_belongs_to_its_key(persistent: Path) -> None:
    config = persistent
    env = {"VOLTGATE_API_KEYS": f"{ALICE},{BOB}"}
    with running_gateway(config, config.parent / "first.log", env=env) as gateway:
        first, _ = create_raw(gateway.client(api_key=ALICE), input="My name is Zed.", max_output_tokens=16)
    with running_gateway(config, config.parent / "second.log", env=env) as gateway:
        alice, bob = gateway.client(api_key=ALICE), gateway.client(api_key=BOB)
        assert alice.responses.retrieve(first.id).output_text == first.output_text
        second, _ = create_raw(alice, input="What is my name?", previous_response_id=first.id, max_output_tokens=16)
        assert second.usage is not None and first.usage is not None
        assert second.usage.input_tokens > first.usage.input_tokens
        with pytest.raises(openai.NotFoundError):  # another key's responses do not exist for it
            bob.responses.retrieve(first.id)
        with pytest.raises(openai.BadRequestError):
            bob.responses.create(model=MODEL, input="?", previous_response_id=first.id, max_output_tokens=4)
        with pytest.raises(openai.AuthenticationError):
            gateway.client(api_key="vg-wrong").responses.create(model=MODEL, input="hi", max_output_tokens=4)
        samples = scrape(gateway)
        assert metric(samples, "voltgate:requests_total", endpoint="responses", status="200", model=MODEL) == 1
        assert metric(samples, "voltgate:requests_total", endpoint="responses", status="400") == 1
        assert metric(samples, "voltgate:requests_total", endpoint="responses", status="401") == 1
        # The retrievals are counted too (every request is, issue 35), under no model: alice's 200, bob's 404.
        assert metric(samples, "voltgate:requests_total", endpoint="responses", status="200", model="unknown") == 1
        assert metric(samples, "voltgate:requests_total", endpoint="responses", status="404") == 1
    assert (config.parent / "data" / "responses.sqlite3").is_file()
