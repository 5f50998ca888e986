"""Anthropic's Messages API through `voltgate serve` on the real SmolLM2, with the official anthropic SDK.

Messages are validated with the SDK's own types (`anthropic.types.Message`), errors must come in Anthropic's
envelope with the right status. This SDK has no `temperature` argument any more, so determinism is asked
for through `extra_body` (the gateway still takes it, as Anthropic's HTTP API does).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
from anthropic.types import Message, MessageTokensCount

from gateway.ops.auth import hash_key
from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, running_gateway, write_config
from tests.e2e.streams import COUNTING, metric, scrape

pytestmark = pytest.mark.e2e

GREEDY = {"temperature": 0}
SHORT = [{"role": "user", "content": "What is 2+2? Answer with one number."}]  # "The answer is 4."
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "Current weather in a city", "input_schema": WEATHER_SCHEMA}
KEY = "vg-messages-e2e-key-3c"
SOLO = "vg-messages-e2e-solo-9d"  # a key with one request in flight at most


def client(gateway: Gateway, api_key: str = "unused", **kwargs: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=api_key, max_retries=0, timeout=120, **kwargs)


def create(gateway: Gateway, **kwargs: Any) -> Message:
    """`messages.create`, its JSON body checked against the SDK's own Message type."""
    raw = client(gateway).messages.with_raw_response.create(model=MODEL, extra_body=GREEDY, **kwargs)
    Message.model_validate(raw.http_response.json())
    return raw.parse()


def prompt_tokens(usage: Any) -> int:
    """The whole prompt as Anthropic counts it: uncached input plus what the prefix cache served."""
    return int(usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0))


def assert_anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    return message


def test_create_answers_a_message(gateway: Gateway) -> None:
    message = create(gateway, max_tokens=64, messages=SHORT)
    assert message.id.startswith("msg_") and (message.role, message.model) == ("assistant", MODEL)
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["text"]
    assert "4" in message.content[0].text  # type: ignore[union-attr]
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0


def test_a_system_prompt_and_max_tokens_are_honoured(gateway: Gateway) -> None:
    system = "You are a terse assistant. " * 20  # longer than the default system prompt of SmolLM2's template
    message = create(gateway, max_tokens=3, system=system, messages=SHORT)
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    plain = create(gateway, max_tokens=3, messages=SHORT)
    assert prompt_tokens(message.usage) > prompt_tokens(plain.usage) + 60


def test_stream_accumulates_to_the_final_message(gateway: Gateway) -> None:
    with client(gateway).messages.stream(model=MODEL, max_tokens=64, messages=SHORT, extra_body=GREEDY) as stream:
        kinds = []
        text = []
        for event in stream:
            kinds.append(event.type)
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                text.append(event.delta.text)
        final = stream.get_final_message()
    Message.model_validate(final.model_dump(mode="json"))
    assert kinds[0] == "message_start" and kinds.count("message_start") == 1
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == "".join(text) and "4" in "".join(text)  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.usage.input_tokens > 0 and final.usage.output_tokens > 0
    unary = create(gateway, max_tokens=64, messages=SHORT)
    assert unary.content[0].text == final.content[0].text  # type: ignore[union-attr]


def test_a_stop_sequence_cuts_the_text_and_is_reported_as_the_stop_sequence(gateway: Gateway) -> None:
    """The real worker ends the text before the stop string and names the string it matched (`stop_reason`, as
    vLLM does), so the Message says `stop_reason: "stop_sequence"` and `stop_sequence: <the string>`, the same
    streamed and not."""
    days = [{"role": "user", "content": "List the days of the week."}]
    full = create(gateway, max_tokens=24, messages=days)
    text = "".join(block.text for block in full.content if block.type == "text")
    word = text.split()[2]
    stops = ["never-stop-here", word]
    cut = create(gateway, max_tokens=24, messages=days, stop_sequences=stops)
    assert "".join(block.text for block in cut.content if block.type == "text") == text[: text.index(word)]
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", word)
    with client(gateway).messages.stream(
        model=MODEL, max_tokens=24, messages=days, stop_sequences=stops, extra_body=GREEDY
    ) as stream:
        deltas = [event for event in stream if event.type == "message_delta"]
        final = stream.get_final_message()
    assert [(d.delta.stop_reason, d.delta.stop_sequence) for d in deltas] == [("stop_sequence", word)]
    assert [block.model_dump() for block in final.content] == [block.model_dump() for block in cut.content]
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", word)
    plain = create(gateway, max_tokens=64, messages=SHORT, stop_sequences=["never-stop-here"])
    assert (plain.stop_reason, plain.stop_sequence) == ("end_turn", None)  # a stop sequence it never wrote


def test_message_start_reports_the_prompts_tokens_and_a_resent_prompt_its_cache_hit(gateway: Gateway) -> None:
    """message_start carries the real `input_tokens` (Anthropic sends them there; Claude Code reads them), the
    same as the final usage; sent again, the prompt's prefix-cache hit is `cache_read_input_tokens` there too."""
    question = [{"role": "user", "content": "Name the largest planet of the solar system, in one word."}]
    starts, finals = [], []
    for _ in range(2):
        with client(gateway).messages.stream(model=MODEL, max_tokens=4, messages=question, extra_body=GREEDY) as stream:
            events = list(stream)
            final = stream.get_final_message()
        assert events[0].type == "message_start"
        starts.append(events[0].message.usage)  # type: ignore[union-attr]
        finals.append(final.usage)
    for start, final in zip(starts, finals, strict=True):
        assert start.input_tokens == final.input_tokens > 0
        assert start.cache_read_input_tokens == final.cache_read_input_tokens
        assert start.output_tokens == 0 and final.output_tokens > 0
    assert (starts[1].cache_read_input_tokens or 0) > 0
    assert prompt_tokens(starts[1]) == prompt_tokens(starts[0])


def test_the_chat_pass_through_sends_usage_only_in_its_last_chunk(gateway: Gateway) -> None:
    """The first-chunk usage the Messages API asks for is never on an OpenAI chat stream: usage comes in the last
    chunk when asked for (`include_usage`), and not at all otherwise."""
    chat = openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)
    for options in ({"include_usage": True}, None):
        chunks = list(chat.chat.completions.create(
            model=MODEL, messages=SHORT, max_tokens=4, stream=True, temperature=0,
            **({"stream_options": options} if options else {}),  # type: ignore[arg-type]
        ))  # fmt: skip
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [c.usage is not None for c in chunks] == [False] * (len(chunks) - 1) + [options is not None]


def test_a_forced_tool_use_then_its_result_gets_a_text_answer(gateway: Gateway) -> None:
    ask = {"role": "user", "content": "What is the weather in Paris?"}
    called = create(
        gateway, max_tokens=64, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"}, messages=[ask]
    )
    assert called.stop_reason == "tool_use"
    uses = [block for block in called.content if block.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id
    assert isinstance(uses[0].input, dict)
    jsonschema.validate(uses[0].input, WEATHER_SCHEMA)
    result = {"type": "tool_result", "tool_use_id": uses[0].id, "content": json.dumps({"celsius": 18})}
    answered = create(
        gateway, max_tokens=48, tools=[WEATHER], tool_choice={"type": "none"},
        messages=[ask, {"role": "assistant", "content": called.content}, {"role": "user", "content": [result]}],
    )  # fmt: skip
    assert [block.type for block in answered.content] == ["text"]
    assert answered.content[0].text.strip()  # type: ignore[union-attr]
    assert answered.stop_reason in ("end_turn", "max_tokens")


def test_a_streamed_tool_use_has_its_input_as_json_deltas(gateway: Gateway) -> None:
    with client(gateway).messages.stream(
        model=MODEL, max_tokens=64, tools=[WEATHER], tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": "Weather in Rome?"}], extra_body=GREEDY,
    ) as stream:  # fmt: skip
        final = stream.get_final_message()
    uses = [block for block in final.content if block.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1
    jsonschema.validate(uses[0].input, WEATHER_SCHEMA)


def test_count_tokens_is_the_prompt_the_model_sees(gateway: Gateway) -> None:
    counted = client(gateway).messages.count_tokens(model=MODEL, messages=SHORT)
    assert isinstance(counted, MessageTokensCount)
    message = create(gateway, max_tokens=8, messages=SHORT)
    assert counted.input_tokens == prompt_tokens(message.usage)  # the count ran first: most of it is cached
    with_tools = client(gateway).messages.count_tokens(model=MODEL, messages=SHORT, tools=[WEATHER])
    assert with_tools.input_tokens > counted.input_tokens
    deferred = [{**WEATHER, "defer_loading": True}]  # Claude Code's tool search: not in the prompt until found
    with_deferred = client(gateway).messages.count_tokens(model=MODEL, messages=SHORT, tools=deferred)  # type: ignore[arg-type]
    assert with_deferred.input_tokens == counted.input_tokens


@pytest.mark.parametrize(
    ("body", "status", "kind", "names"),
    [
        ({"messages": SHORT}, 400, "invalid_request_error", "max_tokens"),
        ({"max_tokens": 8, "messages": SHORT, "model": "no-such-model"}, 404, "not_found_error", "no-such-model"),
        ({"max_tokens": 8, "messages": SHORT, "stop_sequences": [str(i) for i in range(17)]}, 400,
         "invalid_request_error", "stop_sequences"),
        ({"max_tokens": 8, "messages": SHORT, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 400,
         "invalid_request_error", "tools.0.type"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]}, 400,
         "invalid_request_error", "messages.0.content.0.type"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, 400,
         "invalid_request_error", "messages.0.content.0.source"),
    ],
)  # fmt: skip
def test_errors_come_in_anthropics_envelope(
    gateway: Gateway, body: dict[str, Any], status: int, kind: str, names: str
) -> None:
    response = httpx.post(
        gateway.url + "/v1/messages", json={"model": MODEL, **body}, headers={"anthropic-version": "2023-06-01"},
        timeout=10,
    )  # fmt: skip
    assert names in assert_anthropic_error(response, status, kind)


def test_the_sdk_raises_its_own_errors(gateway: Gateway) -> None:
    with pytest.raises(anthropic.NotFoundError) as missing:
        client(gateway).messages.create(model="no-such-model", max_tokens=8, messages=SHORT)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError):
        client(gateway).messages.create(model=MODEL, max_tokens=0, messages=SHORT)


@pytest.fixture(scope="module")
def keyed(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("messages-keyed")
    solo = {"id": "solo", "sha256": hash_key(SOLO), "max_concurrent": 1}
    # One slot, so a second request queues; keep-alive comments every 0.2 s while it waits.
    config = write_config(
        tmp,
        smollm2_path,
        free_port(),
        models=[model_entry(smollm2_path, concurrency=1)],
        auth={"keys": [solo]},
        data_dir=str(tmp / "data"),
        keepalive_interval_s=0.2,
    )
    with running_gateway(config, tmp / "gateway.log", env={"VOLTGATE_API_KEYS": KEY}) as gateway:
        yield gateway


def test_a_keyed_gateway_takes_x_api_key_or_a_bearer_token_and_counts_refusals(keyed: Gateway) -> None:
    url = keyed.url + "/v1/messages"
    body = {"model": MODEL, "max_tokens": 4, "messages": SHORT}
    for headers in ({}, {"x-api-key": "vg-wrong"}, {"authorization": "Bearer vg-wrong"}):
        assert_anthropic_error(httpx.post(url, json=body, headers=headers, timeout=10), 401, "authentication_error")
    with pytest.raises(anthropic.AuthenticationError):
        client(keyed, api_key="vg-wrong").messages.create(model=MODEL, max_tokens=4, messages=SHORT)
    by_key = client(keyed, api_key=KEY).messages.create(model=MODEL, max_tokens=4, messages=SHORT)
    by_token = anthropic.Anthropic(base_url=keyed.url, auth_token=KEY, max_retries=0).messages.create(
        model=MODEL, max_tokens=4, messages=SHORT
    )
    assert by_key.usage.output_tokens > 0 and by_token.usage.output_tokens > 0
    counted = client(keyed, api_key=KEY).messages.count_tokens(model=MODEL, messages=SHORT)
    assert counted.input_tokens > 0
    samples = scrape(keyed)
    assert metric(samples, "voltgate:requests_total", endpoint="messages", status="401") == 4
    assert metric(samples, "voltgate:requests_total", endpoint="messages", status="200") == 2
    assert metric(samples, "voltgate:requests_total", endpoint="count_tokens", status="200") == 1


async def test_a_key_limit_is_a_429_in_anthropics_envelope_and_a_client_leaving_is_a_499(keyed: Gateway) -> None:
    url = keyed.url + "/v1/messages"
    # The key is held by a chat stream that cannot end early: SmolLM2's end tokens (0, 2) are banned, so it is
    # still generating its 1,500 tokens when the second request arrives.
    held = {"model": MODEL, "max_tokens": 1500, "stream": True, "logit_bias": {"0": -100, "2": -100},
            "messages": [{"role": "user", "content": COUNTING}]}  # fmt: skip
    counting = {"model": MODEL, "max_tokens": 1500, "stream": True, "messages": [{"role": "user", "content": COUNTING}]}
    headers = {"x-api-key": SOLO}
    async with httpx.AsyncClient(timeout=60) as http:
        async with http.stream(
            "POST", keyed.url + "/v1/chat/completions", json=held, headers={"authorization": f"Bearer {SOLO}"}
        ) as first:
            assert first.status_code == 200
            # Kept in a name: a line iterator dropped by `break` is finalised at once, and its aclose() closes
            # the response, which the gateway rightly takes for the client leaving (499, key released).
            lines = first.aiter_lines()
            async for line in lines:
                if '"content":"' in line:
                    break
            second = await http.post(url, json={**counting, "stream": False, "max_tokens": 8}, headers=headers)
            assert "in flight" in assert_anthropic_error(second, 429, "rate_limit_error")
            assert 1 <= int(second.headers["retry-after"]) <= 60
        # Leaving a Messages stream mid-stream closes the connection: the generation is aborted, accounted 499.
        deadline = time.monotonic() + 20
        while True:  # the chat stream's abort frees the key a moment after its connection closes
            async with http.stream("POST", url, json=counting, headers=headers) as leaving:
                if leaving.status_code == 200:
                    async for line in leaving.aiter_lines():
                        if line.startswith("event: content_block_delta"):
                            break
                    break
                await leaving.aread()
            assert time.monotonic() < deadline, "the key was never released"
            time.sleep(0.2)
    deadline = time.monotonic() + 20
    while metric(scrape(keyed), "voltgate:requests_total", endpoint="messages", status="499") != 1:
        assert time.monotonic() < deadline, "the abandoned stream was never accounted"
        time.sleep(0.2)
    again = client(keyed, api_key=SOLO).messages.create(model=MODEL, max_tokens=4, messages=SHORT)
    assert again.usage.output_tokens > 0  # the slot and the key's in-flight count were released


async def _holding_the_slot(http: httpx.AsyncClient, gateway: Gateway, release: asyncio.Event) -> None:
    """A chat stream that cannot end early (end tokens banned) holds the one slot until `release`."""
    held = {"model": MODEL, "max_tokens": 1500, "stream": True, "logit_bias": {"0": -100, "2": -100},
            "messages": [{"role": "user", "content": COUNTING}]}  # fmt: skip
    headers = {"authorization": f"Bearer {KEY}"}
    async with http.stream("POST", gateway.url + "/v1/chat/completions", json=held, headers=headers) as first:
        assert first.status_code == 200
        await release.wait()


async def test_queued_messages_and_responses_streams_hear_keepalives_and_the_sdks_read_through_them(
    keyed: Gateway,
) -> None:
    """Behind a stream holding the one slot, a Messages stream and a Responses stream wait with SSE comments
    (a proxy or client idle timeout would otherwise cut them); the anthropic and openai SDKs skip them and read
    the events once the slot frees."""
    async with httpx.AsyncClient(timeout=60) as http:
        release = asyncio.Event()
        holder = asyncio.create_task(_holding_the_slot(http, keyed, release))
        await asyncio.sleep(1.0)
        body = {"model": MODEL, "max_tokens": 8, "stream": True, "messages": SHORT}
        async with http.stream("POST", keyed.url + "/v1/messages", json=body, headers={"x-api-key": KEY}) as raw:
            assert raw.status_code == 200
            lines = raw.aiter_lines()  # the headers are here; message_start waits for the prompt's slot
            seen = [await anext(lines)]
            assert seen[-1].startswith(": waiting for a free slot"), seen
            seen += [await anext(lines) for _ in range(3)]  # a ping with it: an event the SDKs and agents count
            assert seen[1:3] == ["", "event: ping"], seen
            release.set()
            await holder
            rest = [line async for line in lines]
        events = [line[7:] for line in seen + rest if line.startswith("event: ")]
        assert set(events[: events.index("message_start")]) == {"ping"} and events[-1] == "message_stop"
        start = json.loads(next(line for line in rest if line.startswith('data: {"type":"message_start"'))[6:])
        assert start["message"]["usage"]["input_tokens"] > 0

        release = asyncio.Event()
        holder = asyncio.create_task(_holding_the_slot(http, keyed, release))
        await asyncio.sleep(1.0)
        asyncio.get_running_loop().call_later(1.5, release.set)
        anthropic_client = anthropic.AsyncAnthropic(base_url=keyed.url, api_key=KEY, max_retries=0)
        async with anthropic_client.messages.stream(model=MODEL, max_tokens=8, messages=SHORT) as stream:
            message = await stream.get_final_message()
        await holder
        assert message.stop_reason in ("end_turn", "max_tokens") and message.content[0].type == "text"

        release = asyncio.Event()
        holder = asyncio.create_task(_holding_the_slot(http, keyed, release))
        await asyncio.sleep(1.0)
        asyncio.get_running_loop().call_later(1.5, release.set)
        openai_client = openai.AsyncOpenAI(base_url=keyed.url + "/v1", api_key=KEY, max_retries=0)
        # Room to finish: the SDK's final response needs `response.completed` (a cut one ends `incomplete`).
        question = {"model": MODEL, "input": "What is 2+2?", "max_output_tokens": 64, "temperature": 0}
        async with openai_client.responses.stream(**question) as events:  # type: ignore[arg-type]
            response = await events.get_final_response()
        await holder
        assert response.status == "completed" and response.output_text
