"""The Responses and Messages routes in-process (no worker): refusals in each API's envelope, accounted under
their own endpoint label; keys from either header; chat parameter names mapped back to the client's."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import Config
from gateway.errors import ErrorCode, GatewayError
from gateway.ops.auth import hash_key, presented_key
from gateway.ops.metrics import Metrics
from gateway.protocol import ChatCompletionRequest
from gateway.translate.params import MESSAGES, RESPONSES, renamed, translated
from tests.openai_schema import assert_matches_openai

KEY = "vg-unit-key"
USER = [{"role": "user", "content": "hi"}]


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, metrics: Metrics, *, keyed: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    keys = [{"id": "team", "sha256": hash_key(KEY)}] if keyed else []
    cfg = Config.model_validate(
        {
            "server": {"data_dir": str(tmp_path / "data")},
            "models": [{"name": "m", "sources": [{"gguf": "/nonexistent.gguf"}]}],
            "auth": {"keys_env": None, "keys": keys},
        }
    )
    app = create_app(cfg, [], refused={"m": "does not fit"}, metrics=metrics)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http


def count(metrics: Metrics, endpoint: str, status: int) -> float:
    return sum(
        s.value
        for family in metrics.registry.collect()
        if family.name == "voltgate:requests"
        for s in family.samples
        if s.name.endswith("_total") and s.labels["endpoint"] == endpoint and s.labels["status"] == str(status)
    )


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    message: str = body["error"]["message"]
    return message


async def test_messages_refusals_are_anthropic_errors_counted_as_messages(tmp_path: Path) -> None:
    metrics = Metrics(gpu=False)
    body = {"model": "m", "max_tokens": 4, "messages": USER}
    async with gateway(tmp_path, metrics) as http:
        unauthenticated = await http.post("/v1/messages", json=body)
        wrong = await http.post("/v1/messages", json=body, headers={"x-api-key": "vg-wrong"})
        unplaced = await http.post("/v1/messages", json=body, headers={"x-api-key": KEY})
        unknown = await http.post("/v1/messages", json={**body, "model": "x"}, headers={"x-api-key": KEY})
        no_limit = await http.post("/v1/messages", json={"model": "m", "messages": USER}, headers={"x-api-key": KEY})
        counted = await http.post("/v1/messages/count_tokens", json={"model": "m"}, headers={"x-api-key": KEY})
    assert "API key" in anthropic_error(unauthenticated, 401, "authentication_error")
    anthropic_error(wrong, 401, "authentication_error")
    assert "could not be placed" in anthropic_error(unplaced, 503, "overloaded_error")
    anthropic_error(unknown, 404, "not_found_error")
    assert anthropic_error(no_limit, 400, "invalid_request_error") == "missing required parameter: max_tokens"
    assert "messages" in anthropic_error(counted, 400, "invalid_request_error")
    assert count(metrics, "messages", 401) == 2
    assert [count(metrics, "messages", status) for status in (503, 404, 400)] == [1, 1, 1]
    assert count(metrics, "count_tokens", 400) == 1


async def test_responses_refusals_are_openai_errors_counted_as_responses(tmp_path: Path) -> None:
    metrics = Metrics(gpu=False)
    auth = {"authorization": f"Bearer {KEY}"}
    async with gateway(tmp_path, metrics) as http:
        unauthenticated = await http.post("/v1/responses", json={"model": "m", "input": "hi"})
        hi = {"model": "m", "input": "hi"}
        builtin = await http.post("/v1/responses", json={**hi, "tools": [{"type": "file_search"}]}, headers=auth)
        previous = await http.post("/v1/responses", json={**hi, "previous_response_id": "resp_x"}, headers=auth)
        unplaced = await http.post("/v1/responses", json={"model": "m", "input": "hi"}, headers=auth)
        by_x_api_key = await http.post("/v1/responses", json={"model": "m", "input": "hi"}, headers={"x-api-key": KEY})
        missing = await http.get("/v1/responses/resp_x", headers=auth)
        missing_items = await http.get("/v1/responses/resp_x/input_items", headers=auth)
        deleted = await http.delete("/v1/responses/resp_x", headers=auth)
        anonymous = await http.get("/v1/responses/resp_x")
        bad_limit = await http.get("/v1/responses/resp_x/input_items", params={"limit": 0}, headers=auth)
    for response, status, param in [
        (unauthenticated, 401, None), (builtin, 400, "tools[0].type"), (previous, 400, "previous_response_id"),
        (unplaced, 503, "model"), (by_x_api_key, 503, "model"), (missing, 404, "response_id"),
        (missing_items, 404, "response_id"), (deleted, 404, "response_id"), (anonymous, 401, None),
        (bad_limit, 400, "limit"),
    ]:  # fmt: skip
        assert response.status_code == status, response.text
        assert_matches_openai("ErrorResponse", response.json())
        assert response.json()["error"]["param"] == param
    assert count(metrics, "responses", 401) == 2  # the POST's and the anonymous GET's: every request is counted
    assert count(metrics, "responses", 404) == 3
    assert count(metrics, "responses", 400) == 3  # the GET's bad limit too
    assert count(metrics, "responses", 503) == 2
    assert count(metrics, "chat", 400) == 0


async def test_open_mode_stores_nothing_until_a_response_is_stored(tmp_path: Path) -> None:
    async with gateway(tmp_path, Metrics(gpu=False), keyed=False) as http:
        response = await http.post("/v1/responses", json={"model": "m", "input": "hi"})
    assert response.status_code == 503
    assert not (tmp_path / "data").exists()  # the store opens its database on first use


def test_the_key_comes_from_a_bearer_token_or_x_api_key() -> None:
    assert presented_key("Bearer vg-a", None) == "vg-a"
    assert presented_key(None, "vg-b") == "vg-b"
    assert presented_key("Bearer vg-a", "vg-b") == "vg-a"
    assert presented_key("Basic abc", "vg-b") == "vg-b"
    assert presented_key("Basic abc", None) is None
    assert presented_key(None, None) is None


@pytest.mark.parametrize(
    ("body", "param", "responses_param", "messages_param"),
    [
        ({"stop": [str(i) for i in range(17)]}, "stop", "stop", "stop_sequences"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "max_output_tokens", "max_tokens"),
        ({"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
         "messages[0].content[0].type", "input", "messages"),
        ({"temperature": 9}, "temperature", "temperature", "temperature"),
    ],
)  # fmt: skip
def test_chat_refusals_name_the_translated_apis_parameters(
    body: dict[str, Any], param: str, responses_param: str, messages_param: str
) -> None:
    chat = {"model": "m", "messages": USER, **body}
    for names, expected in ((RESPONSES, responses_param), (MESSAGES, messages_param)):
        with pytest.raises(GatewayError) as caught:
            translated(names, lambda: ChatCompletionRequest.model_validate(chat))
        assert caught.value.param == expected
        assert caught.value.message.split(":")[0] != param or param == expected  # the message names it too
    ok = translated(MESSAGES, lambda: ChatCompletionRequest.model_validate({"model": "m", "messages": USER}))
    assert ok.messages[0].role == "user"


def test_renamed_keeps_status_code_and_retry_after_and_maps_tool_paths() -> None:
    path = "tools[2].function.parameters"
    error = GatewayError(ErrorCode.INVALID_REQUEST, f"{path}: bad", param=path)
    assert (renamed(error, MESSAGES).param, renamed(error, MESSAGES).message) == (
        "tools.2.input_schema", "tools.2.input_schema: bad",
    )  # fmt: skip
    assert renamed(error, RESPONSES).param == "tools[2].parameters"
    busy = GatewayError(ErrorCode.RATE_LIMITED, "busy", param="max_tokens", retry_after_s=3)
    moved = renamed(busy, RESPONSES)
    assert (moved.param, moved.status, moved.code, moved.retry_after_s) == ("max_output_tokens", 429, busy.code, 3)
    unnamed = GatewayError(ErrorCode.UPSTREAM_ERROR, "boom")
    assert renamed(unnamed, MESSAGES) is unnamed
    assert json.dumps(renamed(error, RESPONSES).body())  # still renders
