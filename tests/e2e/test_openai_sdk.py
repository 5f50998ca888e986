"""The official openai SDK against `voltgate serve` and the real SmolLM2 worker, checked against OpenAI's schemas."""

from __future__ import annotations

import json

import openai
import pytest

from tests.e2e.conftest import MODEL, Gateway
from tests.openai_schema import assert_completion_chunk, assert_matches_openai

pytestmark = pytest.mark.e2e
HELLO = [{"role": "user", "content": "Say hi in one short sentence."}]


def test_models_list_shows_the_configured_model(gateway: Gateway) -> None:
    models = gateway.client().models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert_matches_openai("ListModelsResponse", models.model_dump(mode="json", exclude_unset=True))
    model = gateway.client().models.retrieve(MODEL)
    assert model.owned_by and model.created > 0


def test_non_streaming_chat_returns_a_real_completion(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=32, temperature=0)
    assert_matches_openai("CreateChatCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert completion.usage.prompt_tokens > 5
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_alias_reaches_the_same_model(gateway: Gateway) -> None:
    completion = gateway.client().chat.completions.create(model="smollm2", messages=HELLO, max_tokens=3)
    assert completion.model == MODEL


def test_streaming_chat_with_include_usage_ends_with_a_usage_chunk(gateway: Gateway) -> None:
    stream = gateway.client().chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    for chunk in chunks:
        assert_matches_openai("CreateChatCompletionStreamResponse", chunk.model_dump(mode="json", exclude_unset=True))
    assert chunks[-1].choices == []
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 0
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] in (
        ["stop"],
        ["length"],
    )
    assert len({c.id for c in chunks}) == 1


def test_streaming_without_include_usage_sends_no_usage_chunk(gateway: Gateway) -> None:
    chunks = list(gateway.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, stream=True))
    assert all(c.choices for c in chunks)
    assert all(c.usage is None for c in chunks)


def test_max_tokens_gives_length_and_exact_usage(gateway: Gateway) -> None:
    prompt = [{"role": "user", "content": "Write a long story about a dragon."}]
    completion = gateway.client().chat.completions.create(model=MODEL, messages=prompt, max_tokens=5)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5


def test_max_completion_tokens_is_honoured(gateway: Gateway) -> None:
    prompt = [{"role": "user", "content": "Write a long story about a dragon."}]
    completion = gateway.client().chat.completions.create(model=MODEL, messages=prompt, max_completion_tokens=3)
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 3


def test_stop_sequence_stops_the_text(gateway: Gateway) -> None:
    prompt = [{"role": "user", "content": "Write two sentences about the sea."}]
    client = gateway.client()
    full = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=40, temperature=0)
    text = full.choices[0].message.content or ""
    cut = text.find(" ", len(text) // 3)
    assert cut > 0, text
    stop = text[cut : cut + 4]
    stopped = client.chat.completions.create(model=MODEL, messages=prompt, max_tokens=40, temperature=0, stop=[stop])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].message.content == text[: text.index(stop)]
    assert stop not in (stopped.choices[0].message.content or "")


def test_json_mode_returns_json(gateway: Gateway) -> None:
    prompt = [{"role": "user", "content": "Give me a JSON object with a name and an age."}]
    completion = gateway.client().chat.completions.create(
        model=MODEL, messages=prompt, max_tokens=60, response_format={"type": "json_object"}, temperature=0
    )
    content = completion.choices[0].message.content or ""
    if completion.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert content.lstrip().startswith("{")


def test_text_completion(gateway: Gateway) -> None:
    completion = gateway.client().completions.create(model=MODEL, prompt="The capital of France is", max_tokens=5)
    assert_matches_openai("CreateCompletionResponse", completion.model_dump(mode="json", exclude_unset=True))
    assert completion.choices[0].text
    assert completion.usage is not None and completion.usage.completion_tokens <= 5


def test_streaming_text_completion(gateway: Gateway) -> None:
    chunks = list(
        gateway.client().completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, stream=True)
    )
    for chunk in chunks:
        assert_completion_chunk(chunk.model_dump(mode="json", exclude_unset=True))
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "".join(c.choices[0].text for c in chunks if c.choices)


def test_unknown_model_is_not_found(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        gateway.client().chat.completions.create(model="gpt-9", messages=HELLO)
    assert info.value.code == "model_not_found"


def test_unknown_model_is_not_found_when_streaming(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError):
        gateway.client().chat.completions.create(model="gpt-9", messages=HELLO, stream=True)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": HELLO, "max_tokens": -1}, "max_tokens"),
        ({"messages": HELLO, "temperature": 5}, "temperature"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
        ({"messages": HELLO, "n": 17}, "n"),
        ({"messages": HELLO, "top_logprobs": 3}, "top_logprobs"),
        ({"messages": HELLO, "functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ],
)
def test_bad_requests_raise_bad_request_error_naming_the_parameter(gateway: Gateway, kwargs: dict, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client().chat.completions.create(model=MODEL, **kwargs)
    assert info.value.param == param


def test_prompt_longer_than_the_context_is_context_length_exceeded(gateway: Gateway) -> None:
    long_prompt = [{"role": "user", "content": "hello " * 5000}]
    with pytest.raises(openai.BadRequestError) as info:
        gateway.client().chat.completions.create(model=MODEL, messages=long_prompt, max_tokens=5)
    assert info.value.code == "context_length_exceeded"
