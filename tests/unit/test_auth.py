"""API keys: hashing, `voltgate keys create`, Bearer checks, allow-lists and per-key limits (no sockets)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from gateway.app import create_app
from gateway.cli import cli
from gateway.config import AuthSettings, Config, KeySpec
from gateway.errors import ErrorCode, GatewayError
from gateway.ops.auth import KEY_PREFIX, KeyStore, Principal, hash_key, new_key

SECRET = "vg-unit-test-secret-0123456789"


def store(*specs: KeySpec, env: str | None = None) -> KeyStore:
    return KeyStore(AuthSettings(keys=specs), env)


def spec(key: str = SECRET, **limits: object) -> KeySpec:
    return KeySpec.model_validate({"id": "alice", "sha256": hash_key(key), **limits})


def auth_error(keys: KeyStore, header: str | None) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        keys.authenticate(header)
    return info.value


# -- keys ----------------------------------------------------------------------------------------------
def test_new_keys_are_random_prefixed_and_hashed_with_sha256() -> None:
    a, b = new_key(), new_key()
    assert a != b and a.startswith(KEY_PREFIX) and len(a) > 40
    assert hash_key(a) == hashlib.sha256(a.encode()).hexdigest()


def test_keys_create_prints_the_key_once_and_a_hash_only_config_entry() -> None:
    result = CliRunner().invoke(
        cli, ["keys", "create", "alice", "--model", "smollm2-135m", "--rpm", "30", "--max-concurrent", "2"]
    )
    assert result.exit_code == 0, result.output
    key, *rest = result.stdout.splitlines()
    assert key.startswith(KEY_PREFIX)
    assert result.stdout.count(key) == 1  # shown once, never inside the config entry
    (entry,) = yaml.safe_load("\n".join(rest))
    assert entry == {
        "id": "alice",
        "sha256": hash_key(key),
        "models": ["smollm2-135m"],
        "requests_per_minute": 30,
        "max_concurrent": 2,
    }
    KeySpec.model_validate(entry)  # pastes straight into `auth.keys`
    assert "shown once" in result.stderr


# -- authentication --------------------------------------------------------------------------------------
def test_no_keys_is_open_mode() -> None:
    keys = store()
    assert keys.open_mode
    assert keys.authenticate(None).key_id == "open"


def test_missing_key_is_401_authentication_error() -> None:
    error = auth_error(store(spec()), None)
    assert error.status == 401
    assert error.body()["error"]["type"] == "authentication_error"
    assert error.code is ErrorCode.INVALID_API_KEY
    assert error.headers()["x-should-retry"] == "false"


@pytest.mark.parametrize("header", ["Bearer wrong", f"Basic {SECRET}", SECRET, "Bearer ", f"Bearer {SECRET}x"])
def test_wrong_or_malformed_key_is_401(header: str) -> None:
    error = auth_error(store(spec()), header)
    assert error.status == 401
    assert SECRET not in error.message


@pytest.mark.parametrize("header", [f"Bearer {SECRET}", f"bearer {SECRET}", f"Bearer  {SECRET} "])
def test_hashed_key_authenticates_as_its_id(header: str) -> None:
    assert store(spec()).authenticate(header).key_id == "alice"


def test_env_keys_are_plain_comma_separated_and_logged_by_a_short_id_only() -> None:
    keys = store(env=" vg-one , ,vg-two")
    assert not keys.open_mode
    one = keys.authenticate("Bearer vg-one")
    two = keys.authenticate("Bearer vg-two")
    assert one.key_id != two.key_id
    for principal, plain in ((one, "vg-one"), (two, "vg-two")):
        assert plain not in principal.key_id
        assert principal.models == ()  # env keys may use every model
    assert auth_error(keys, "Bearer vg-three").status == 401


def test_config_and_env_keys_work_together() -> None:
    keys = store(spec(), env="vg-env")
    assert keys.authenticate(f"Bearer {SECRET}").key_id == "alice"
    assert keys.authenticate("Bearer vg-env").key_id.startswith("env-")


# -- allow-lists and limits ------------------------------------------------------------------------------
def test_model_outside_the_allow_list_is_403_permission_error() -> None:
    principal = store(spec(models=["smollm2-135m"])).authenticate(f"Bearer {SECRET}")
    principal.check_model("smollm2-135m")
    principal.check_model("canonical", aliases=("smollm2-135m",))  # allowed by alias
    with pytest.raises(GatewayError) as info:
        principal.check_model("other")
    assert info.value.status == 403
    assert info.value.body()["error"]["type"] == "permission_error"
    assert info.value.param == "model"


def retry_after(error: GatewayError) -> int:
    return int(error.headers()["retry-after"])


def test_requests_per_minute_is_429_with_retry_after() -> None:
    principal = Principal("alice", requests_per_minute=2)
    for _ in range(2):
        principal.admit()
        principal.done(0)
    with pytest.raises(GatewayError) as info:
        principal.admit()
    assert info.value.status == 429
    assert info.value.code is ErrorCode.RATE_LIMITED
    assert 1 <= retry_after(info.value) <= 60


def test_max_concurrent_is_429_until_a_request_finishes() -> None:
    principal = Principal("alice", max_concurrent=1)
    principal.admit()
    with pytest.raises(GatewayError) as info:
        principal.admit()
    assert info.value.status == 429 and 1 <= retry_after(info.value) <= 60
    principal.done(10)
    principal.admit()
    assert principal.in_flight == 1


def test_tokens_per_minute_counts_finished_requests() -> None:
    principal = Principal("alice", tokens_per_minute=100)
    principal.admit()
    principal.done(60)
    principal.admit()
    principal.done(60)
    with pytest.raises(GatewayError) as info:
        principal.admit()
    assert info.value.status == 429 and 1 <= retry_after(info.value) <= 60


class UnsummableDeque(deque[tuple[float, int]]):
    """The token window's deque, refusing to be walked: the window's total must be kept, not re-summed."""

    def __iter__(self) -> Iterator[tuple[float, int]]:
        raise AssertionError("the token window was summed")


def test_the_token_window_total_is_kept_incrementally_as_tokens_come_and_expire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("gateway.ops.auth.time.monotonic", lambda: now[0])
    principal = Principal("alice", tokens_per_minute=100)
    principal._tokens = UnsummableDeque()
    for used, at in ((30, 0.0), (40, 20.0), (20, 40.0)):
        now[0] = 1000.0 + at
        principal.admit()
        principal.done(used)
    assert principal.tokens_in_window == 90
    now[0] = 1061.0  # the first 30 tokens are older than 60 s
    principal.admit()
    assert principal.tokens_in_window == 60
    principal.done(45)  # 105 in the window: the next request waits for the 40 of t=20 to expire
    with pytest.raises(GatewayError) as info:
        principal.admit()
    assert 1 <= retry_after(info.value) <= 60
    now[0] = 1081.0
    principal.admit()
    assert principal.tokens_in_window == 65


def test_a_key_without_limits_keeps_no_window() -> None:
    principal = Principal("bob")
    for _ in range(1000):
        principal.admit()
        principal.done(50)
    assert not principal._tokens and not principal._requests and principal.tokens_in_window == 0


def test_refused_request_does_not_count_against_the_key() -> None:
    principal = Principal("alice", requests_per_minute=1, max_concurrent=1)
    principal.admit()
    with pytest.raises(GatewayError):
        principal.admit()
    assert principal.in_flight == 1
    principal.done(0)
    assert principal.in_flight == 0


# -- the app ---------------------------------------------------------------------------------------------
def config(**auth: object) -> Config:
    return Config.model_validate(
        {"models": [{"name": "m", "sources": [{"gguf": "/nonexistent.gguf"}]}], "auth": {"keys_env": None, **auth}}
    )


@contextlib.asynccontextmanager
async def client(cfg: Config) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(cfg, [], metrics=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            yield http


async def test_routes_answer_401_in_openai_shape_without_a_valid_key() -> None:
    cfg = config(keys=[spec().model_dump()])
    async with client(cfg) as http:
        for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("GET", "/v1/placement")):
            for headers in ({}, {"authorization": "Bearer nope"}):
                response = await http.request(method, path, headers=headers, json={})
                assert response.status_code == 401, (path, response.text)
                assert response.headers["content-type"].startswith("application/json")
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["type"] == "authentication_error"
        ok = await http.get("/v1/models", headers={"authorization": f"Bearer {SECRET}"})
        assert ok.status_code == 200
        # Operations endpoints stay open for probes and scrapers.
        assert (await http.get("/health")).status_code == 200
        assert (await http.get("/metrics")).status_code == 200


async def test_open_mode_is_logged_loudly_at_start(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="voltgate"):
        async with client(config()):
            pass
    assert any(r.levelno == logging.WARNING and "OPEN MODE" in r.getMessage() for r in caplog.records)


async def test_keyed_mode_does_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="voltgate"):
        async with client(config(keys=[spec().model_dump()])):
            pass
    assert not any("OPEN MODE" in r.getMessage() for r in caplog.records)
