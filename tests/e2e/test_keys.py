"""API keys through the real gateway: 401/403/429 in OpenAI's shape, allow-lists, limits, and logs without keys.

Keys come from `voltgate keys create` (hashes in the config) and VOLTGATE_API_KEYS (plain, for quick starts);
the gateway logs JSON (`--log-format json`) so the access log can be checked field by field.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.conftest import REPO, free_port
from tests.e2e.conftest import MODEL, Gateway, model_entry, start_gateway, stop_gateway, write_config
from tests.e2e.streams import chat_body, counting_body, stream
from tests.openai_schema import assert_matches_openai

pytestmark = pytest.mark.e2e

OTHER = "smollm2-other"
ENV_KEY = "vg-env-quickstart-key-7f3a9c"
# A marker that must never reach the log: prompts are not logged unless explicitly enabled.
SECRET_PROMPT = "zebra-quartz-prompt-marker-1c9e Say hi."
MAX_TOKENS_CAP = 64


@dataclass
class Keyed:
    gateway: Gateway
    keys: dict[str, str]  # key id -> plain key
    cli_output: dict[str, str]

    def client(self, key_id: str) -> openai.OpenAI:
        return self.gateway.client(api_key=self.keys[key_id])

    def auth(self, key_id: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[key_id]}"}


def create_key(key_id: str, *args: str) -> tuple[str, dict[str, object], str]:
    """Run the real `voltgate keys create`; return (plain key, config entry, full stdout)."""
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "keys", "create", key_id, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    key, *entry = done.stdout.splitlines()
    (spec,) = yaml.safe_load("\n".join(entry))
    return key, spec, done.stdout


@pytest.fixture(scope="module")
def keyed(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keyed]:
    tmp = tmp_path_factory.mktemp("keyed")
    created = {
        "full": create_key("full"),
        "limited": create_key("limited", "--model", MODEL),
        "rpm": create_key("rpm", "--rpm", "2"),
        "solo": create_key("solo", "--max-concurrent", "1"),
    }
    config = write_config(
        tmp,
        smollm2_path,
        free_port(),
        models=[model_entry(smollm2_path), model_entry(smollm2_path, OTHER, concurrency=1)],
        auth={"keys": [spec for _, spec, _ in created.values()]},
        max_tokens_cap=MAX_TOKENS_CAP,
    )
    gateway = start_gateway(
        config, tmp / "gateway.log", env={"VOLTGATE_API_KEYS": ENV_KEY}, args=["--log-format", "json"]
    )
    keys = {key_id: key for key_id, (key, _, _) in created.items()} | {"env": ENV_KEY}
    try:
        gateway.wait_ready()
        yield Keyed(gateway, keys, {key_id: out for key_id, (_, _, out) in created.items()})
    finally:
        stop_gateway(gateway)


def assert_error(response: httpx.Response, status: int, error_type: str, code: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert_matches_openai("ErrorResponse", body)
    assert body["error"]["type"] == error_type
    assert body["error"]["code"] == code
    return body["error"]


def test_keys_create_prints_the_key_once_and_stores_only_its_hash(keyed: Keyed, smollm2_path: Path) -> None:
    for key_id, out in keyed.cli_output.items():
        key = keyed.keys[key_id]
        assert out.count(key) == 1
    config = (Path(keyed.gateway.log_path).parent / "voltgate.yaml").read_text()
    for key in keyed.keys.values():
        assert key not in config


@pytest.mark.parametrize(
    ("headers", "why"),
    [({}, "missing"), ({"authorization": "Bearer vg-not-a-key"}, "wrong"), ({"authorization": "Basic abc"}, "scheme")],
)
def test_missing_or_invalid_key_is_401_authentication_error(keyed: Keyed, headers: dict, why: str) -> None:
    url = keyed.gateway.base_url
    for response in (
        httpx.post(url + "/chat/completions", json=chat_body(stream=False), headers=headers, timeout=10),
        httpx.post(url + "/chat/completions", json=chat_body(), headers=headers, timeout=10),
        httpx.get(url + "/models", headers=headers, timeout=10),
    ):
        assert_error(response, 401, "authentication_error", "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        keyed.gateway.client(api_key="vg-not-a-key").models.list()


def test_hashed_and_env_keys_are_served(keyed: Keyed) -> None:
    for key_id in ("full", "env"):
        reply = keyed.client(key_id).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=3
        )
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_model_outside_the_allow_list_is_403_and_hidden_from_models(keyed: Keyed) -> None:
    url = keyed.gateway.base_url
    for body in (chat_body(model=OTHER, stream=False), chat_body(model=OTHER)):
        response = httpx.post(url + "/chat/completions", json=body, headers=keyed.auth("limited"), timeout=10)
        error = assert_error(response, 403, "permission_error", "model_not_allowed")
        assert error["param"] == "model"
    with pytest.raises(openai.PermissionDeniedError):
        keyed.client("limited").chat.completions.create(
            model=OTHER, messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert [m.id for m in keyed.client("limited").models.list()] == [MODEL]
    assert sorted(m.id for m in keyed.client("full").models.list()) == sorted([MODEL, OTHER])
    hidden = httpx.get(url + f"/models/{OTHER}", headers=keyed.auth("limited"), timeout=10)
    assert hidden.status_code == 404
    # The alias of an allowed model is allowed too.
    ok = keyed.client("limited").chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert ok.model


def test_requests_per_minute_limit_is_429_with_retry_after(keyed: Keyed) -> None:
    client = keyed.client("rpm")
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    response = httpx.post(
        keyed.gateway.base_url + "/chat/completions",
        json=chat_body(stream=False, max_tokens=2),
        headers=keyed.auth("rpm"),
        timeout=10,
    )
    assert_error(response, 429, "rate_limit_error", "rate_limit_exceeded")
    assert 1 <= int(response.headers["retry-after"]) <= 60
    # Other keys are not affected by this key's limit.
    keyed.client("full").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )


async def test_max_concurrent_per_key_is_429_while_its_stream_runs(keyed: Keyed) -> None:
    url = keyed.gateway.base_url
    async with httpx.AsyncClient(timeout=60) as client:
        async with client.stream(
            "POST", url + "/completions", json=counting_body(MAX_TOKENS_CAP), headers=keyed.auth("solo")
        ) as first:
            assert first.status_code == 200
            lines = first.aiter_lines()
            while not (await lines.__anext__()).startswith("data: {"):
                pass
            second = await client.post(
                url + "/chat/completions", json=chat_body(stream=False), headers=keyed.auth("solo")
            )
            assert_error(second, 429, "rate_limit_error", "rate_limit_exceeded")
            assert 1 <= int(second.headers["retry-after"]) <= 60
            rest = [line async for line in lines]
        assert [line for line in rest if line][-1] == "data: [DONE]"
        # The moment a stream ends the key may send again: back-to-back streams are never refused.
        for _ in range(8):
            again = await stream(client, url + "/chat/completions", chat_body(max_tokens=2), headers=keyed.auth("solo"))
            assert again.status == 200 and again.done, again.body[:300]


def test_max_tokens_over_the_cap_is_400_naming_the_field_sent(keyed: Keyed) -> None:
    url = keyed.gateway.base_url + "/chat/completions"
    for field in ("max_tokens", "max_completion_tokens"):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], field: MAX_TOKENS_CAP + 1}
        for stream_it in (False, True):
            response = httpx.post(url, json={**body, "stream": stream_it}, headers=keyed.auth("full"), timeout=10)
            error = assert_error(response, 400, "invalid_request_error", "invalid_request_error")
            assert error["param"] == field
            assert str(MAX_TOKENS_CAP) in error["message"]
            assert response.headers["x-should-retry"] == "false"
    at_cap = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS_CAP}
    assert httpx.post(url, json=at_cap, headers=keyed.auth("full"), timeout=60).status_code == 200


def access_entries(log: str) -> list[dict]:
    entries = []
    for line in log.splitlines():
        if line.startswith("{") and '"voltgate.access"' in line:
            entries.append(json.loads(line))
    return entries


def access_entry(gateway: Gateway, request_id: str, timeout_s: float = 10) -> dict:
    """The access-log entry of one request (a stream is logged just after its last byte, so wait for it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        by_id = {e["request_id"]: e for e in access_entries(gateway.log())}
        if request_id in by_id:
            return by_id[request_id]
        assert time.monotonic() < deadline, f"no access log entry for {request_id}"
        time.sleep(0.05)


def test_json_logs_carry_request_fields_and_never_keys_or_prompts(keyed: Keyed) -> None:
    response = httpx.post(
        keyed.gateway.base_url + "/chat/completions",
        json={**chat_body(SECRET_PROMPT, max_tokens=4, stream=False)},
        headers={**keyed.auth("full"), "x-request-id": "req-json-log-check"},
        timeout=60,
    )
    assert response.status_code == 200
    streamed = httpx.post(
        keyed.gateway.base_url + "/chat/completions",
        json=chat_body(SECRET_PROMPT, max_tokens=4, stream_options={"include_usage": True}),
        headers={**keyed.auth("env"), "x-request-id": "req-json-log-stream"},
        timeout=60,
    )
    assert streamed.status_code == 200
    entry = access_entry(keyed.gateway, "req-json-log-check")
    assert entry["model"] == MODEL
    assert entry["key_id"] == "full"
    assert entry["status"] == 200
    assert entry["prompt_tokens"] > 0 and entry["completion_tokens"] == 4
    assert entry["latency_ms"] > 0
    assert entry["level"] == "info" and entry["ts"].endswith("Z")
    env_entry = access_entry(keyed.gateway, "req-json-log-stream")
    assert env_entry["key_id"].startswith("env-") and env_entry["completion_tokens"] == 4
    # Refusals are logged with the key id too.
    refused = httpx.post(
        keyed.gateway.base_url + "/chat/completions",
        json=chat_body(SECRET_PROMPT, model=OTHER, stream=False),
        headers={**keyed.auth("limited"), "x-request-id": "req-json-log-403"},
        timeout=10,
    )
    assert refused.status_code == 403
    refusal = access_entry(keyed.gateway, "req-json-log-403")
    log = keyed.gateway.log()
    assert (refusal["key_id"], refusal["model"], refusal["status"]) == ("limited", OTHER, 403)
    # Log records (the gateway's, uvicorn's and the worker's relayed lines) are one JSON object per line;
    # only the placement table printed at start is not.
    records = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
    loggers = {r["logger"] for r in records}
    assert {"voltgate", "voltgate.access", "voltgate.supervisor"} <= loggers
    assert any(name.startswith("voltgate.worker.") for name in loggers)
    # No key and no prompt text anywhere in the log.
    for key in keyed.keys.values():
        assert key not in log
    assert "zebra-quartz" not in log
