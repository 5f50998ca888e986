"""Schemathesis against the gateway's own OpenAPI document, on a real gateway with the real SmolLM2 worker.

For every operation in `create_app(...).openapi()`, generated requests (valid and invalid per the schema,
half of the bodies naming the real model) must never get a 5xx, and every answer must match the gateway's
own schema and OpenAI's: error envelopes, completions, chunks. Most schema-valid bodies still use some
parameter no engine here honours (a 400 naming it), so a second, hypothesis-built family of plausible chat
requests drives the real worker with random text, roles, sampling settings and stops.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.config import Config
from tests.conftest import free_port
from tests.e2e.conftest import MODEL, Gateway, start_gateway, stop_gateway, write_config
from tests.openai_schema import assert_matches_openai

pytestmark = pytest.mark.integration

MAX_EXAMPLES = 60
MAX_TOKENS_CAP = 8  # keeps every generation that reaches the worker short


def _own_schema() -> dict[str, Any]:
    """The document the app serves, built without starting anything."""
    config = Config.model_validate({"models": [{"name": MODEL, "sources": [{"gguf": "/unused.gguf"}]}]})
    return create_app(config, []).openapi()


OWN_SCHEMA = _own_schema()
OPERATIONS = [
    pytest.param(path, method.upper(), mode, id=f"{method.upper()} {path} {mode.value}")
    for path, methods in OWN_SCHEMA["paths"].items()
    for method, operation in methods.items()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or "requestBody" in operation
]
OPENAI_BODIES = {
    ("POST", "/v1/chat/completions"): ("CreateChatCompletionResponse", "CreateChatCompletionStreamResponse"),
    ("POST", "/v1/completions"): ("CreateCompletionResponse", "CreateCompletionResponse"),
    ("GET", "/v1/models"): ("ListModelsResponse", None),
    ("GET", "/v1/models/{model_id}"): ("Model", None),
}


@dataclass
class Served:
    gateway: Gateway
    schema: Any  # schemathesis' loaded schema of the served /openapi.json


@pytest.fixture(scope="module")
def served(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    tmp = tmp_path_factory.mktemp("schemathesis")
    config = write_config(tmp, smollm2_path, free_port(), max_tokens_cap=MAX_TOKENS_CAP)
    gateway = start_gateway(config, tmp / "gateway.log")
    try:
        gateway.wait_ready()
        yield Served(gateway, schemathesis.openapi.from_url(gateway.url + "/openapi.json"))
    finally:
        stop_gateway(gateway)


def test_served_schema_is_the_apps_own_and_every_ref_resolves(served: Served) -> None:
    served_doc = requests.get(served.gateway.url + "/openapi.json", timeout=10).json()
    assert served_doc == json.loads(json.dumps(OWN_SCHEMA))
    text = json.dumps(served_doc)
    defined = set(served_doc["components"]["schemas"])
    refs = {part.split('"')[0] for part in text.split('"#/components/schemas/')[1:]}
    assert refs <= defined, refs - defined


def point_at_the_real_model(case: Any, real: bool) -> Any:
    """Half of the generated bodies name the served model, so generation really runs on the worker."""
    if real and isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = MODEL
    return case


def header(response: Any, name: str) -> str:
    """One header of schemathesis' response (its headers map names to lists of values)."""
    values = response.headers.get(name) or [""]
    return str(values[0])


def check_openai_shapes(method: str, path: str, response: Any) -> None:
    """Our own schema says little about 200 bodies: hold them (and every error) to OpenAI's schema."""
    assert header(response, "x-request-id")
    kind = header(response, "content-type")
    if response.status_code >= 400:
        assert kind.startswith("application/json"), kind
        body = response.json()
        assert_matches_openai("ErrorResponse", body)
        assert set(body["error"]) == {"message", "type", "param", "code"}
        if response.status_code in (429, 503):
            assert 1 <= int(header(response, "retry-after")) <= 60
        return
    names = OPENAI_BODIES.get((method, path))
    if names is None:
        return
    whole, chunk = names
    if kind.startswith("text/event-stream"):
        assert chunk is not None
        frames = [f for f in response.text.split("\n\n") if f.strip()]
        assert frames[-1] == "data: [DONE]", frames[-3:]
        for frame in frames[:-1]:
            if frame.startswith(":"):
                continue
            assert frame.startswith("data: "), frame
            data = json.loads(frame[6:])
            if "error" in data:
                assert_matches_openai("ErrorResponse", data)
            else:
                assert_matches_openai(chunk, data)
        return
    assert_matches_openai(whole, response.json())


@pytest.mark.parametrize(("path", "method", "mode"), OPERATIONS)
def test_generated_requests_get_no_5xx_and_schema_conforming_answers(
    served: Served, path: str, method: str, mode: GenerationMode
) -> None:
    operation = served.schema[path][method]
    cases = st.builds(point_at_the_real_model, operation.as_strategy(generation_mode=mode), st.booleans())

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],  # no shrinking: keeps a failing run bounded too
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=cases)
    def run(case: Any) -> None:
        response = case.call(base_url=served.gateway.url, timeout=60)
        case.validate_response(
            response,
            checks=[
                not_a_server_error,
                status_code_conformance,
                content_type_conformance,
                response_schema_conformance,
            ],
        )
        check_openai_shapes(method, path, response)

    run()
    # Whatever was thrown at it, the gateway still serves normally afterwards.
    ready = requests.get(served.gateway.url + "/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    assert ready.json()["models"][MODEL]["running"] == 0


# -- plausible requests, all the way through the worker ---------------------------------------------------
text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=200)
turns = st.lists(st.tuples(text, text), min_size=0, max_size=2)


@st.composite
def chat_requests(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    for user, assistant in draw(turns):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    last = draw(text)
    content: Any = [{"type": "text", "text": last}] if draw(st.booleans()) else last
    messages.append({"role": "user", "content": content})
    body: dict[str, Any] = {"model": MODEL, "messages": messages, "stream": draw(st.booleans())}
    optional = {
        "max_tokens": st.integers(1, MAX_TOKENS_CAP),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.01, 1),
        "seed": st.integers(0, 2**31 - 1),
        "stop": st.one_of(text, st.lists(text, min_size=1, max_size=4)),
        "presence_penalty": st.floats(-2, 2),
        "frequency_penalty": st.floats(-2, 2),
        "user": text,
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            body[name] = draw(strategy)
    if body["stream"] and draw(st.booleans()):
        body["stream_options"] = {"include_usage": True}
    return body


def test_plausible_chat_requests_reach_the_worker_and_come_back_well_formed(served: Served) -> None:
    """Random unicode, roles, sampling settings and stops through the real worker: 200 and OpenAI shapes."""
    url = served.gateway.base_url + "/chat/completions"

    @settings(max_examples=40, deadline=None, derandomize=True, database=None, phases=[Phase.generate])
    @given(body=chat_requests())
    def run(body: dict[str, Any]) -> None:
        response = requests.post(url, json=body, timeout=60)
        assert response.status_code == 200, (response.status_code, response.text[:500])
        kind = response.headers["content-type"]
        if not body["stream"]:
            assert kind.startswith("application/json")
            reply = response.json()
            assert_matches_openai("CreateChatCompletionResponse", reply)
            assert reply["usage"]["completion_tokens"] <= body.get("max_tokens", MAX_TOKENS_CAP)
            return
        assert kind.startswith("text/event-stream")
        frames = [f for f in response.text.split("\n\n") if f.strip()]
        assert frames[-1] == "data: [DONE]"
        chunks = [json.loads(f[6:]) for f in frames[:-1] if f.startswith("data: ")]
        assert not [c for c in chunks if "error" in c], chunks[-1]
        for chunk in chunks:
            assert_matches_openai("CreateChatCompletionStreamResponse", chunk)
        has_usage = bool(chunks) and chunks[-1]["choices"] == [] and chunks[-1].get("usage") is not None
        assert has_usage == bool(body.get("stream_options"))

    run()
