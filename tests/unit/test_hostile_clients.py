"""Hostile clients at the request edge, in-process (issue 35, items 4 and 5): a page from another origin
cannot make the gateway act (non-JSON bodies are 415, foreign `Origin`s 403, the admin API always), what
the recorded clients send still passes, and every answer is counted and logged, admin actions audited.

The model is refused at placement (`tests.unit.test_hostile_inputs`), so a request that passes the edge
gets the refused model's 503; the slow-body, disconnect and connection cases need real sockets:
`tests/e2e/test_hostile_clients.py`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config import Config, ImageLimits
from gateway.errors import GatewayError
from gateway.ops.metrics import Metrics
from gateway.protocol.anthropic import MessagesRequest
from gateway.protocol.parsing import parse_body
from gateway.serving.browser import is_json, same_origin
from gateway.serving.images import ImageBudget, load_data_uri
from gateway.translate.messages import client_image_param, to_chat
from tests.conftest import REPO
from tests.unit.test_hostile_inputs import MODEL, VALID
from tests.unit.test_translated_routes import count

CLIENTS = REPO / "tests" / "fixtures" / "clients"
FOREIGN = "https://evil.example"
PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()  # checked later: never decoded here
HUGE = {"content-length": str(1 << 30), "content-type": "application/json"}  # refused before a byte is read


@contextlib.asynccontextmanager
async def gateway(tmp_path: Path, metrics: Metrics, **server: Any) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway in open mode, its ASGI client connecting from 127.0.0.1 (so the admin API answers it)."""
    cfg = Config.model_validate(
        {
            "server": {"data_dir": str(tmp_path / "data"), **server},
            "models": [{"name": MODEL, "sources": [{"gguf": "/nonexistent.gguf"}]}],
            "auth": {"keys_env": None},
        }
    )
    app = create_app(cfg, [], refused={MODEL: "does not fit"}, metrics=metrics)
    transport = httpx.ASGITransport(app=app)
    client = httpx.AsyncClient(transport=transport, base_url="http://gw:8000")
    async with app.router.lifespan_context(app), client as http:
        yield http


@pytest.fixture
async def http(tmp_path: Path, metrics: Metrics) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(tmp_path, metrics) as client:
        yield client


@pytest.fixture
def metrics() -> Metrics:
    return Metrics(gpu=False)


def test_json_content_types_and_origins() -> None:
    assert is_json("application/json") and is_json("Application/JSON; charset=utf-8") and is_json("application/x+json")
    assert not is_json("text/plain") and not is_json("application/x-www-form-urlencoded") and not is_json("")
    assert same_origin("http://gw:8000", ["gw:8000"]) and same_origin("http://GW", ["gw:80"])
    assert same_origin("https://gw.example", ["127.0.0.1:8000", "gw.example"])  # X-Forwarded-Host
    assert not same_origin("http://gw:8001", ["gw:8000"]) and not same_origin("null", ["gw:8000"])
    assert not same_origin("http://evil.example", ["gw:8000", ""]) and not same_origin("http://gw:x", ["gw:8000"])


@pytest.mark.parametrize(
    ("content_type", "body"),
    [("text/plain", json.dumps(VALID["/v1/chat/completions"])), ("application/x-www-form-urlencoded", "a=b"),
     ("multipart/form-data; boundary=x", "--x--"), (None, json.dumps(VALID["/v1/chat/completions"]))],
)  # fmt: skip
async def test_a_body_not_declared_as_json_is_415(
    http: httpx.AsyncClient, metrics: Metrics, content_type: str | None, body: str
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    response = await http.post("/v1/chat/completions", content=body.encode(), headers=headers)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert response.headers["x-request-id"]
    messages = await http.post("/v1/messages", content=b"{}", headers=headers)
    assert messages.status_code == 415 and messages.json()["type"] == "error", messages.text  # Anthropic's envelope
    reload = await http.post("/admin/reload", content=b"a=b", headers={"content-type": "text/plain"})
    assert reload.status_code == 415, reload.text  # a form POST to the admin API does nothing
    assert [count(metrics, endpoint, 415) for endpoint in ("chat", "messages", "admin")] == [1, 1, 1]


async def test_a_foreign_origin_is_refused(http: httpx.AsyncClient, metrics: Metrics) -> None:
    chat = await http.post("/v1/chat/completions", json=VALID["/v1/chat/completions"], headers={"origin": FOREIGN})
    assert chat.status_code == 403 and "cross-origin" in chat.json()["error"]["message"], chat.text
    no_cors = await http.post("/admin/reload", headers={"origin": FOREIGN})  # a `no-cors` fetch: no body
    assert no_cors.status_code == 403, no_cors.text
    own = await http.post("/admin/reload", headers={"origin": "http://gw:8000"})  # the status page's own origin
    assert own.status_code == 400 and "without a config file" in own.text, own.text
    assert count(metrics, "chat", 403) == 1 and count(metrics, "admin", 403) == 1 and count(metrics, "admin", 400) == 1


async def test_cors_origins_open_the_api_but_never_the_admin_api(tmp_path: Path, metrics: Metrics) -> None:
    async with gateway(tmp_path, metrics, cors_origins=[FOREIGN]) as http:
        chat = await http.post("/v1/chat/completions", json=VALID["/v1/chat/completions"], headers={"origin": FOREIGN})
        assert chat.status_code == 503, chat.text  # past the edge: the refused model's answer
        assert chat.headers["access-control-allow-origin"] == FOREIGN
        other = await http.get("/v1/models", headers={"origin": "https://other.example"})
        assert other.status_code == 403, other.text
        admin = await http.post("/admin/reload", headers={"origin": FOREIGN})
        assert admin.status_code == 403, admin.text


@pytest.mark.parametrize("fixture", sorted(p.name for p in CLIENTS.glob("*.json")))
async def test_recorded_clients_pass_the_edge(http: httpx.AsyncClient, fixture: str) -> None:
    """Each recorded exchange (the SDKs, Codex, Claude Code, Open WebUI) with its own headers reaches the
    route: the refused model's 503, never 415 or 403."""
    for exchange in json.loads((CLIENTS / fixture).read_text())["exchanges"]:
        body = exchange["body"]
        raw = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        headers = {k: v for k, v in exchange["headers"].items() if k.lower() not in ("content-length", "host")}
        response = await http.post(exchange["path"], content=raw, headers=headers)
        assert response.status_code not in (403, 415), (exchange["path"], response.text[:300])


async def test_every_answer_is_counted_and_logged(
    http: httpx.AsyncClient, metrics: Metrics, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.access")
    answers = [
        (await http.get("/v1/nope"), 404, "other"), (await http.get("/v1/models/nope"), 404, "models"),
        (await http.get("/v1/chat/completions"), 405, "chat"), (await http.get("/v1/models"), 200, "models"),
        (await http.get("/v1/responses/resp_nope"), 404, "responses"),
        (await http.get("/ui/api/status"), 200, "other"),
        (await http.post("/v1/chat/completions", content=b"x" * 100, headers=HUGE), 413, "chat"),
    ]  # fmt: skip
    for response, status, endpoint in answers:
        assert response.status_code == status, response.text
        assert count(metrics, endpoint, status) >= 1, (endpoint, status)
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.access"]
    by_id = {line["request_id"]: line for line in lines}
    for response, status, _ in answers:
        assert by_id[response.headers["x-request-id"]]["status"] == status


async def test_admin_actions_are_audited(http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="voltgate.audit")
    await http.post("/admin/reload")
    await http.post(f"/admin/models/{MODEL}/unload")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "voltgate.audit"]
    assert [(line["action"], line["who"]) for line in lines] == [("reload", "127.0.0.1"), ("unload", "127.0.0.1")]
    assert lines[0]["status"] == 400 and "without a config file" in lines[0]["error"]
    assert lines[1]["model"] == MODEL and lines[1]["request_id"]


@pytest.mark.parametrize("magic", [b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF89a", b"RIFF\x00\x00\x00\x00WEBPVP8 "])
def test_a_corrupt_image_names_no_object_address(magic: bytes) -> None:
    url = "data:;base64," + base64.b64encode(magic + b"\x00garbage" * 8).decode()
    with pytest.raises(GatewayError) as caught:
        load_data_uri(url, ImageBudget(ImageLimits()), param="p")
    assert "corrupt" in caught.value.message or "not PNG" in caught.value.message, caught.value.message
    assert " at 0x" not in caught.value.message and "BytesIO" not in caught.value.message, caught.value.message


def test_a_messages_image_error_names_the_clients_block() -> None:
    """Images keep their order through the translation, whatever moves around them (system prompts, tool
    results split into their own chat messages): the n-th chat image part is the client's n-th image."""
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    body = {
        "model": MODEL, "max_tokens": 8, "system": "be brief",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"},
                                         {"type": "text", "text": "and"}, image]},
        ],
        "tools": [{"name": "f", "input_schema": {"type": "object"}}],
    }  # fmt: skip
    req = parse_body(json.dumps(body).encode(), MessagesRequest, dotted=True)
    chat = to_chat(req)
    chat_params = [
        f"messages[{i}].content[{j}].image_url" for i, m in enumerate(chat.messages) for j, _ in m.image_parts()
    ]
    assert len(chat_params) == 2
    assert client_image_param(chat_params[1] + ".url", chat, req) == "messages.2.content.2.source"
    assert client_image_param(chat_params[0], chat, req) == "messages.0.content.1.source"
    assert client_image_param("max_tokens", chat, req) is None
