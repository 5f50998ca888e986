"""A model's `sampling` defaults fill the fields a request leaves out, never the ones it sets."""

from __future__ import annotations

import pytest

from gateway.config import ConfigError, ModelSpec
from gateway.protocol.engine_requests import EngineTarget
from gateway.protocol.requests import ChatCompletionRequest


def chat(**params: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **params}
    return ChatCompletionRequest.model_validate(body)


def test_defaults_fill_what_the_request_leaves_out() -> None:
    request = chat(top_p=0.5).to_engine(EngineTarget(model="m", sampling={"temperature": 0.0, "top_p": 0.9}))
    assert request.temperature == 0.0 and request.top_p == 0.5


def test_no_defaults_leave_the_engines_own() -> None:
    assert chat().to_engine(EngineTarget(model="m")).temperature is None


def test_the_config_key_is_checked() -> None:
    spec = ModelSpec.model_validate({"name": "m", "sources": [{"gguf": "x.gguf"}], "sampling": {"temperature": 0}})
    assert spec.sampling.model_dump(exclude_none=True) == {"temperature": 0}
    with pytest.raises((ConfigError, ValueError)):
        ModelSpec.model_validate({"name": "m", "sources": [{"gguf": "x.gguf"}], "sampling": {"temperature": 9}})
    with pytest.raises((ConfigError, ValueError)):
        ModelSpec.model_validate({"name": "m", "sources": [{"gguf": "x.gguf"}], "sampling": {"mirostat": 2}})
