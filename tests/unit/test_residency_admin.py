"""The admin API's access rules and views through the app in-process (no sockets, no workers started):
a key needs `scopes: [admin]`; open mode admits loopback clients only; on-demand models show their state
in /admin/models, /v1/models (`status`) and /ready (which they do not hold back)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import yaml
from typer.testing import CliRunner

from backends.base import DeploymentPlan, EngineName
from gateway.app import create_app
from gateway.cli import cli
from gateway.config import Config
from gateway.ops.auth import hash_key

ADMIN, USER = "vg-admin-key", "vg-user-key"
KEYS = [
    {"id": "ops", "sha256": hash_key(ADMIN), "scopes": ["admin"]},
    {"id": "alice", "sha256": hash_key(USER)},
]


def config(keys: list[dict[str, object]] | None = None) -> Config:
    model = {"name": "od", "sources": [{"gguf": "/nonexistent.gguf"}], "load": "on_demand", "idle_unload_s": 60}
    return Config.model_validate({"models": [model], "auth": {"keys_env": None, "keys": keys or []}})


PLAN = DeploymentPlan(model="od", engine=EngineName.LLAMACPP, source_path=Path("/nonexistent.gguf"),
                      model_format="gguf", context_tokens=512)  # fmt: skip


@contextlib.asynccontextmanager
async def gateway(cfg: Config, client: str = "127.0.0.1") -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(cfg, [PLAN])
    transport = httpx.ASGITransport(app=app, client=(client, 40000))
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        yield http


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def test_open_mode_admits_loopback_clients_only() -> None:
    async with gateway(config()) as http:
        response = await http.get("/admin/models")
        assert response.status_code == 200
        (model,) = response.json()["data"]
        assert (model["model"], model["load"], model["state"], model["in_flight"]) == ("od", "on_demand", "unloaded", 0)
        assert model["idle_unload_s"] == 60
    async with gateway(config(), client="192.168.1.20") as http:
        response = await http.get("/admin/models")
        assert response.status_code == 403
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("permission_error", "permission_denied")
        assert "loopback" in error["message"]


async def test_with_keys_only_an_admin_scoped_key_may_use_the_admin_api() -> None:
    async with gateway(config(KEYS), client="10.0.0.7") as http:
        assert (await http.get("/admin/models")).status_code == 401
        denied = await http.post("/admin/models/od/unload", headers=bearer(USER))
        assert denied.status_code == 403 and "lacks the admin scope" in denied.json()["error"]["message"]
        allowed = await http.get("/admin/models", headers={"x-api-key": ADMIN})
        assert allowed.status_code == 200
        assert "host" in allowed.json()["memory"]
        assert (await http.post("/admin/models/nope/load", headers=bearer(ADMIN))).status_code == 404
        unloaded = await http.post("/admin/models/od/unload", headers=bearer(ADMIN))
        assert unloaded.status_code == 200 and unloaded.json()["state"] == "unloaded"
        assert (await http.get("/v1/models", headers=bearer(USER))).status_code == 200  # inference keys still work


async def test_an_unloaded_on_demand_model_is_listed_with_its_status_and_does_not_hold_back_ready() -> None:
    async with gateway(config()) as http:
        models = (await http.get("/v1/models")).json()["data"]
        assert [(m["id"], m["status"]) for m in models] == [("od", "unloaded")]
        assert (await http.get("/v1/models/od")).json()["status"] == "unloaded"
        ready = await http.get("/ready")
        assert ready.status_code == 200
        assert ready.json()["models"]["od"]["load"] == "on_demand"
        assert ready.json()["models"]["od"]["status"] == "unloaded"


def test_keys_create_prints_an_entry_with_the_admin_scope() -> None:
    result = CliRunner().invoke(cli, ["keys", "create", "ops", "--scope", "admin"])
    assert result.exit_code == 0, result.output
    entry = yaml.safe_load(result.stdout.split("\n", 1)[1])[0]
    assert entry["scopes"] == ["admin"]
    assert hash_key(result.stdout.split("\n", 1)[0]) == entry["sha256"]
    bad = CliRunner().invoke(cli, ["keys", "create", "ops", "--scope", "root"])
    assert bad.exit_code == 2 and "unknown scope root" in bad.output
