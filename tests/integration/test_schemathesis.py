"""Schemathesis against the gateway's own OpenAPI document, on a real gateway with the real SmolLM2 worker.

For every operation in `create_app(...).openapi()`, generated requests (valid and invalid per the schema,
half of the bodies naming the real model) must never get a 5xx, and every answer must match the gateway's
own schema and OpenAI's: error envelopes, completions, chunks. Most schema-valid bodies still use some
parameter no engine here honours (a 400 naming it), so a second, hypothesis-built family of plausible chat
requests drives the real worker with random text, roles, sampling settings and stops.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
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
from tests.e2e.conftest import MODEL, Gateway, running_gateway, write_config
from tests.openai_schema import assert_completion_chunk, assert_matches_openai

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
# Per operation: OpenAI's schema of its whole answer, and the check of one streamed chunk (None: not streamed).
OPENAI_BODIES: dict[tuple[str, str], tuple[str, Callable[[Any], None] | None]] = {
    ("POST", "/v1/chat/completions"): (
        "CreateChatCompletionResponse",
        partial(assert_matches_openai, "CreateChatCompletionStreamResponse"),
    ),
    ("POST", "/v1/completions"): ("CreateCompletionResponse", assert_completion_chunk),
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
    with running_gateway(config, tmp / "gateway.log") as gateway:
        yield Served(gateway, schemathesis.openapi.from_url(gateway.url + "/openapi.json"))


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
                chunk(data)
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


STREAMED = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    "/v1/completions": {"prompt": "hi", "max_tokens": 4},
    "/v1/responses": {"input": "hi"},
}  # /v1/messages is not in the served document: the Anthropic one's fuzz (below) covers it


@pytest.mark.parametrize("path", sorted(STREAMED))
def test_a_streamed_answer_conforms_to_the_published_event_schema(served: Served, path: str) -> None:
    """Each event of a 200 stream against the schema the document gives `text/event-stream` (before OpenAPI 3.2:
    one event's). The generated cases reach a 200 stream only by chance: a `{"type": "string"}` schema failed
    schemathesis' event check once a generated Responses request did (2026-12-07 CI)."""
    case = served.schema[path]["POST"].Case(body={"model": MODEL, "stream": True, **STREAMED[path]})
    response = case.call(base_url=served.gateway.url, timeout=60)
    assert response.status_code == 200 and header(response, "content-type").startswith("text/event-stream")
    case.validate_response(response, checks=[content_type_conformance, response_schema_conformance])
    check_openai_shapes("POST", path, response)


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


# -- OpenAI's and Anthropic's own descriptions of the API: no 5xx for anything they generate ----------------
SCHEMAS = Path(__file__).resolve().parents[1] / "schemas"
PUBLISHED_EXAMPLES = 12  # per operation and mode in the normal suite; the slow one runs many more
PUBLISHED_EXAMPLES_SLOW = 80  # about 1,600 cases in all: `make test-slow` runs it (CI runs both commands)


def _published() -> list[tuple[str, str, str, bool]]:
    """(document, method, path, has a body) of every operation in the two committed documents."""
    out = []
    for name in ("openai_operations.json", "anthropic_messages.json"):
        doc = json.loads((SCHEMAS / name).read_text())
        out += [(name, method.upper(), path, "requestBody" in operation)
                for path, methods in doc["paths"].items() for method, operation in methods.items()]  # fmt: skip
    return out


PUBLISHED = [
    pytest.param(doc, method, path, mode, id=f"{doc.split('_')[0]} {method} {path} {mode.value}")
    for doc, method, path, has_body in _published()
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or has_body  # invalid path parameters: few, and all a 404
]


def check_no_server_error(anthropic: bool, response: Any) -> None:
    """Every answer: below 500, with x-request-id; every error in the API's own JSON envelope."""
    assert response.status_code < 500, (response.status_code, response.text[:500])
    assert header(response, "x-request-id")
    if response.status_code < 400:
        return
    assert header(response, "content-type").startswith("application/json")
    body = response.json()
    if anthropic:
        assert body.get("type") == "error" and set(body["error"]) == {"type", "message"}, (response.status_code, body)
    else:
        assert_matches_openai("ErrorResponse", body)


def fuzz_published(served: Served, doc: str, method: str, path: str, mode: GenerationMode, examples: int) -> None:
    schema = schemathesis.openapi.from_dict(json.loads((SCHEMAS / doc).read_text()))
    operation = schema[path][method]
    anthropic = doc.startswith("anthropic")
    base_url = served.gateway.url if anthropic else served.gateway.base_url
    cases = st.builds(point_at_the_real_model, operation.as_strategy(generation_mode=mode), st.booleans())

    @settings(
        max_examples=examples, deadline=None, derandomize=True, database=None,
        phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False, suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    @given(case=cases)
    def run(case: Any) -> None:
        response = case.call(base_url=base_url, timeout=60)
        check_no_server_error(anthropic, response)

    run()
    ready = requests.get(served.gateway.url + "/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    assert "Traceback" not in served.gateway.log(), served.gateway.log()[-3000:]


@pytest.mark.parametrize(("doc", "method", "path", "mode"), PUBLISHED)
def test_requests_generated_from_the_published_schemas_never_get_a_5xx(
    served: Served, doc: str, method: str, path: str, mode: GenerationMode
) -> None:
    fuzz_published(served, doc, method, path, mode, PUBLISHED_EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "method", "path", "mode"), PUBLISHED)
def test_many_requests_generated_from_the_published_schemas_never_get_a_5xx(
    served: Served, doc: str, method: str, path: str, mode: GenerationMode
) -> None:
    fuzz_published(served, doc, method, path, mode, PUBLISHED_EXAMPLES_SLOW)


def test_hostile_bodies_on_the_real_gateway_are_4xx_and_spec_valid_values_are_served(served: Served) -> None:
    """The hand-written hostile set (tests/unit/test_hostile_inputs.py) against the real worker, where a lone
    surrogate used to fail the relay; `stream: null` and `top_p: 0` are generated for real."""
    from tests.unit.test_hostile_inputs import ANTHROPIC, ROUTES, nested, with_text

    for path in ROUTES:
        hostile = [
            json.dumps({**with_text(path, "\ud800 x"), "model": MODEL}).encode(),
            json.dumps({**with_text(path, "\ud800 x"), "model": MODEL, "stream": True}).encode(),
            b'{"model": "' + MODEL.encode() + b'", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
            json.dumps({**with_text(path, "hi"), "model": MODEL, "tools": [nested(150)]}).encode(),
            json.dumps({**with_text(path, "hi"), "model": MODEL})[:-1].encode() + b', "temperature": NaN}',
        ]
        if path not in ("/v1/completions", "/v1/embeddings"):  # which take no tools (an unknown key is ignored)
            hostile.append(json.dumps({**with_text(path, "hi"), "model": MODEL, "tools": [{"type": ["f"]}]}).encode())
        for raw in hostile:
            response = requests.post(served.gateway.url + path, data=raw, timeout=60,
                                     headers={"content-type": "application/json"})  # fmt: skip
            assert 400 <= response.status_code < 500, (path, raw[:100], response.status_code, response.text[:300])
            assert response.headers["x-request-id"]
            body = response.json()
            assert ("type" in body and body["type"] == "error") if path in ANTHROPIC else "error" in body
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": None, "top_p": 0}),
        ("/v1/completions", {"prompt": "Once", "stream": None, "top_p": 0}),
        ("/v1/responses", {"input": "hi", "top_p": 0}),
    ):
        response = requests.post(served.gateway.url + path, json={"model": MODEL, **body}, timeout=60)
        assert response.status_code == 200, (path, response.text[:300])
        assert response.headers["content-type"].startswith("application/json")
