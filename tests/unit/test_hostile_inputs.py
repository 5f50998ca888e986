"""Hostile bodies on every JSON route, in-process (the model is refused at placement, so nothing reaches a
worker): never a 500, always the route's own error shape with x-request-id; and the one error boundary that
turns a bug into an accounted 500 in that shape.

What JSON allows but no request may carry (`gateway.protocol.json_body`): lone UTF-16 surrogates, nesting
past the depth limit, NaN/Infinity and out-of-range numbers; plus wrong-typed discriminators at every level
of a valid body, huge numbers, duplicate keys, empty and huge arrays.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import Config
from gateway.ops.metrics import Metrics
from gateway.protocol.json_body import MAX_DEPTH
from tests.openai_schema import assert_matches_openai

MODEL = "m"
USER = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
VALID: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": MODEL, "messages": USER, "tools": [TOOL], "tool_choice": "auto",
                             "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    "/v1/completions": {"model": MODEL, "prompt": "hi"},
    "/v1/embeddings": {"model": MODEL, "input": ["hi", "there"]},
    "/v1/responses": {"model": MODEL, "input": [{"type": "message", "role": "user",
                                                 "content": [{"type": "input_text", "text": "hi"}]}],
                      "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                      "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}},
    "/v1/messages": {"model": MODEL, "max_tokens": 8, "system": [{"type": "text", "text": "be brief"}],
                     "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                     "tools": [{"name": "f", "input_schema": {"type": "object"}}], "tool_choice": {"type": "auto"}},
    "/v1/messages/count_tokens": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
}  # fmt: skip
ROUTES = list(VALID)
ANTHROPIC = ("/v1/messages", "/v1/messages/count_tokens")


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, metrics: Metrics | None = None) -> AsyncIterator[httpx.AsyncClient]:
    cfg = Config.model_validate(
        {
            "server": {"data_dir": str(tmp_path / "data")},
            "models": [{"name": MODEL, "sources": [{"gguf": "/nonexistent.gguf"}]}],
            "auth": {"keys_env": None},
        }
    )
    app = create_app(cfg, [], refused={MODEL: "does not fit"}, metrics=metrics or Metrics())
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(tmp_path) as client:
        yield client


def checked(path: str, response: httpx.Response) -> dict[str, Any]:
    """No 5xx but the refused model's 503; the route's error shape; x-request-id. The error object."""
    assert response.headers.get("x-request-id"), response.headers
    assert response.headers["content-type"].startswith("application/json"), response.text[:300]
    body = response.json()
    if path in ANTHROPIC:
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
    else:
        assert_matches_openai("ErrorResponse", body)
    assert response.status_code < 500 or response.status_code == 503, (response.status_code, response.text[:500])
    error: dict[str, Any] = body["error"]
    if response.status_code == 503:
        assert "could not be placed" in error["message"], error
    return error


async def post(http: httpx.AsyncClient, path: str, raw: bytes) -> httpx.Response:
    return await http.post(path, content=raw, headers={"content-type": "application/json"})


# -- the findings, each a 500 before ------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/responses", {"model": MODEL, "input": [{"type": {"a": 1}, "role": "user", "content": "hi"}]},
         "input[0].type"),
        ("/v1/responses", {"model": MODEL, "input": "hi", "tools": [{"type": ["function"]}]}, "tools[0].type"),
        ("/v1/responses", {"model": MODEL, "input": [{"type": "message", "role": "user",
                                                      "content": [{"type": [1], "text": "x"}]}]},
         "input[0].content[0].type"),
        ("/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user",
                                                                          "content": [{"type": {}, "text": "a"}]}]},
         "messages.0.content.0.type"),
        ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user",
                                                                     "content": [{"type": ["text"]}]}]},
         "messages.0.content.0.type"),
    ],
)  # fmt: skip
async def test_a_type_that_is_an_object_or_a_list_is_a_400_naming_it(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], param: str
) -> None:
    response = await post(http, path, json.dumps(body).encode())
    assert response.status_code == 400
    assert param in checked(path, response)["message"]


def with_text(path: str, text: str) -> dict[str, Any]:
    """The route's valid body with `text` where the user's words go."""
    body = copy.deepcopy(VALID[path])
    if path == "/v1/completions":
        body["prompt"] = text
    elif path == "/v1/embeddings":
        body["input"] = [text]
    elif path == "/v1/responses":
        body["input"][0]["content"][0]["text"] = text
    elif path == "/v1/messages":
        body["messages"][0]["content"][0]["text"] = text
    else:
        body["messages"][0]["content"] = text
    return body


SURROGATE_PARAM = {
    "/v1/chat/completions": "messages[0].content", "/v1/completions": "prompt", "/v1/embeddings": "input[0]",
    "/v1/responses": "input[0].content[0].text", "/v1/messages": "messages.0.content.0.text",
    "/v1/messages/count_tokens": "messages.0.content",
}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", ROUTES)
async def test_a_lone_surrogate_in_message_text_is_a_400_naming_the_field(
    http: httpx.AsyncClient, path: str, stream: bool
) -> None:
    body = with_text(path, "\ud800 x")
    if stream and path not in ("/v1/embeddings", "/v1/messages/count_tokens"):
        body["stream"] = True
    raw = json.dumps(body).encode()  # ensure_ascii: the surrogate goes out as the escape `\ud800`
    assert b"\\ud800" in raw
    response = await post(http, path, raw)
    assert response.status_code == 400
    error = checked(path, response)
    assert SURROGATE_PARAM[path] in error["message"] and "surrogate" in error["message"]
    if path not in ANTHROPIC:
        assert error["param"] == SURROGATE_PARAM[path]


@pytest.mark.parametrize("path", ROUTES)
async def test_a_surrogate_pair_is_one_character_and_is_served(http: httpx.AsyncClient, path: str) -> None:
    response = await post(http, path, json.dumps(with_text(path, "smile \U0001f600")).encode())
    assert response.status_code == 503  # past validation: the refused model's answer


@pytest.mark.parametrize("path", ROUTES)
async def test_a_surrogate_in_a_key_is_a_400(http: httpx.AsyncClient, path: str) -> None:
    body = {**VALID[path], "metadata": {"\udfff": "x"}}
    response = await post(http, path, json.dumps(body).encode())
    assert response.status_code == 400 and "surrogate" in checked(path, response)["message"]


def nested(depth: int) -> Any:
    node: Any = {}
    for _ in range(depth):
        node = {"type": "object", "properties": {"p": node}}
    return node


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("depth", [10_000, 900, MAX_DEPTH + 1])
async def test_json_nested_past_the_limit_is_a_400(http: httpx.AsyncClient, path: str, depth: int) -> None:
    raw = json.dumps(VALID[path])[:-1].encode() + b', "extra": ' + b"[" * depth + b"]" * depth + b"}"
    response = await post(http, path, raw)
    assert response.status_code == 400
    assert f"nested deeper than {MAX_DEPTH} levels" in checked(path, response)["message"]


@pytest.mark.parametrize(
    ("path", "where"),
    [
        ("/v1/chat/completions", ("response_format", "json_schema", "schema")),
        ("/v1/chat/completions", ("tools", 0, "function", "parameters")),
        ("/v1/responses", ("text", "format", "schema")),
        ("/v1/responses", ("tools", 0, "parameters")),
        ("/v1/messages", ("tools", 0, "input_schema")),
    ],
)
@pytest.mark.parametrize("levels", [150, 100])
async def test_a_schema_nested_150_deep_is_a_400_at_its_parameter(
    http: httpx.AsyncClient, path: str, where: tuple[str | int, ...], levels: int
) -> None:
    body = copy.deepcopy(VALID[path])
    node = body
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = nested(levels)
    response = await post(http, path, json.dumps(body).encode())
    assert response.status_code == 400
    error = checked(path, response)
    assert f"nested deeper than {MAX_DEPTH} levels at {where[0]}" in error["message"], error


async def test_a_schema_within_the_depth_limit_is_served(http: httpx.AsyncClient) -> None:
    body = copy.deepcopy(VALID["/v1/chat/completions"])
    body["tools"][0]["function"]["parameters"] = nested(25)
    response = await post(http, "/v1/chat/completions", json.dumps(body).encode())
    assert response.status_code == 503, response.text


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    "literal", [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"-1e999", b"1" * 5000, b"1e-400", b"0.0e99999"]
)
async def test_non_finite_and_huge_number_literals_are_refused_or_served(
    http: httpx.AsyncClient, path: str, literal: bytes
) -> None:
    raw = json.dumps(VALID[path])[:-1].encode() + b', "x_extra": {"n": ' + literal + b"}}"
    response = await post(http, path, raw)
    checked(path, response)
    if literal in (b"1e-400", b"0.0e99999"):  # they are 0.0: finite
        assert response.status_code == 503
    else:
        assert response.status_code == 400


HUGE_VALUES = [10**30, -(10**30), 1e308, -1e308, 2**63, 2**64 + 1, 0, -1, "", [], {}, None, True, "x" * 10_000]
FIELDS = ["max_tokens", "max_completion_tokens", "max_output_tokens", "seed", "temperature", "top_p", "top_k", "n",
          "presence_penalty", "frequency_penalty", "logprobs", "top_logprobs", "stream", "stop", "user", "dimensions",
          "logit_bias", "stop_sequences", "metadata", "tool_choice", "tools", "input", "messages",
          "prompt"]  # fmt: skip


@pytest.mark.parametrize("path", ROUTES)
async def test_wrong_and_huge_values_in_every_known_field_never_give_a_500(http: httpx.AsyncClient, path: str) -> None:
    for name in FIELDS:
        for value in HUGE_VALUES:
            body = {**VALID[path], name: value}
            checked(path, await post(http, path, json.dumps(body).encode()))
    checked(path, await post(http, path, json.dumps({**VALID[path], "logit_bias": {str(10**30): 1}}).encode()))


def tagged_places(node: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every discriminator-like key (`type`, `role`) in a body, at every level."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("type", "role"):
                yield (*at, key)
            yield from tagged_places(value, (*at, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from tagged_places(value, (*at, i))


WRONG_TAGS: list[Any] = [{"a": 1}, ["function"], [], 1, 1.5, None, True, "", "no-such-type", "\u0000"]


@pytest.mark.parametrize("path", [p for p in ROUTES if p not in ("/v1/completions", "/v1/embeddings")])
async def test_a_wrong_typed_discriminator_at_any_level_is_a_4xx(http: httpx.AsyncClient, path: str) -> None:
    places = list(tagged_places(VALID[path]))
    assert places, path
    for place in places:
        for wrong in WRONG_TAGS:
            body = copy.deepcopy(VALID[path])
            node = body
            for key in place[:-1]:
                node = node[key]
            node[place[-1]] = wrong
            response = await post(http, path, json.dumps(body).encode())
            checked(path, response)
            assert response.status_code in (400, 503), (place, wrong, response.text)


@pytest.mark.parametrize("path", ROUTES)
async def test_duplicate_keys_empty_and_huge_arrays_never_give_a_500(http: httpx.AsyncClient, path: str) -> None:
    text = json.dumps(VALID[path])
    bodies = [
        text[:-1].encode() + b', "model": 5, "model": "m"}',  # the last one wins, as in most JSON parsers
        text[:-1].encode() + b', "model": "m", "model": {"a": 1}}',
        b'{"model": "m", "messages": [], "input": [], "prompt": [], "tools": []}',
        json.dumps({**VALID[path], "tools": [TOOL] * 2000, "stop": ["x"] * 2000}).encode(),
        json.dumps({**VALID[path], "messages": USER * 5000, "input": ["a"] * 5000, "prompt": ["a"] * 5000}).encode(),
        json.dumps({**VALID[path], "messages": [[[]]] * 100, "input": [[1, 2, [3]]] * 100}).encode(),
        b"", b"null", b"[]", b'"x"', b"1", b"{", b"\xff\xfe", b'{"model": "m"}',
    ]  # fmt: skip
    for raw in bodies:
        response = await post(http, path, raw)
        checked(path, response)
        assert response.status_code in (400, 413, 503), (raw[:80], response.text)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_null_and_top_p_zero_are_accepted(http: httpx.AsyncClient, path: str) -> None:
    body = {**VALID[path], "stream": None, "top_p": 0}
    response = await post(http, path, json.dumps(body).encode())
    assert response.status_code == 503, response.text  # past validation: the refused model's answer


async def test_top_p_zero_is_accepted_on_responses(http: httpx.AsyncClient) -> None:
    body = {**VALID["/v1/responses"], "top_p": 0}
    response = await post(http, "/v1/responses", json.dumps(body).encode())
    assert response.status_code == 503, response.text


# -- the error boundary ---------------------------------------------------------------------------------
def count(metrics: Metrics, endpoint: str, status: int) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == "voltgate:requests"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["endpoint"] == endpoint and s.labels["status"] == str(status)
    )


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]


class Boom(RuntimeError):
    """A bug anywhere in a route."""


def explode(*_: Any, **__: Any) -> Any:
    raise Boom("a bug")


@pytest.mark.parametrize(
    ("path", "target", "endpoint"),
    [
        ("/v1/chat/completions", "gateway.routes.inference.parse_request", "chat"),
        ("/v1/responses", "gateway.routes.responses.parse_body", "responses"),
        ("/v1/messages", "gateway.routes.messages._parse_message", "messages"),
        ("/v1/messages/count_tokens", "gateway.routes.messages._parse_count", "count_tokens"),
    ],
)
async def test_a_bug_while_parsing_is_one_accounted_500_in_the_apis_shape(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    path: str,
    target: str,
    endpoint: str,
) -> None:
    monkeypatch.setattr(target, explode)
    metrics = Metrics()
    caplog.set_level(logging.INFO)
    async with gateway(tmp_path, metrics) as http:
        response = await post(http, path, json.dumps(VALID[path]).encode())
    assert response.status_code == 500
    assert response.headers["x-request-id"]
    body = response.json()
    if path in ANTHROPIC:
        assert body == {"type": "error", "error": {"type": "api_error", "message": body["error"]["message"]}}
    else:
        assert body["error"]["code"] == "internal_error" and body["error"]["type"] == "server_error"
    assert "Boom" not in response.text and "a bug" not in response.text  # no internals to the client
    assert count(metrics, endpoint, 500) == 1
    lines = [line for line in access_lines(caplog) if line["status"] == 500]
    assert len(lines) == 1 and lines[0]["request_id"] == response.headers["x-request-id"], lines
    assert any(r.exc_info and r.exc_info[0] is Boom for r in caplog.records)


async def test_a_bug_on_any_route_is_a_500_with_request_id_counted_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    cfg = Config.model_validate({"server": {"data_dir": str(tmp_path / "d")}, "auth": {"keys_env": None},
                                 "models": [{"name": MODEL, "sources": [{"gguf": "/x.gguf"}]}]})  # fmt: skip
    app = create_app(cfg, [], refused={MODEL: "no"}, metrics=metrics)

    async def boom() -> None:
        raise Boom("a bug")

    app.add_api_route("/v1/boom", boom, methods=["GET"])
    caplog.set_level(logging.INFO)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.get("/v1/boom", headers={"x-request-id": "mine-1"})
    assert response.status_code == 500 and response.headers["x-request-id"] == "mine-1"
    assert_matches_openai("ErrorResponse", response.json())
    assert count(metrics, "other", 500) == 1
    assert [line["request_id"] for line in access_lines(caplog) if line["status"] == 500] == ["mine-1"]
