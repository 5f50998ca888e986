"""The launch secret of a worker other hosts reach: the worker refuses calls without it (401, OpenAI's error
shape), and a launch spec for such a worker binds the named interface and carries the secret."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from backends.base import DeploymentPlan, EngineName
from backends.llamacpp.adapter import LlamaCppAdapter
from backends.llamacpp.worker.auth import TOKEN_ENV, require_token
from gateway.cluster.access import auth_headers, new_worker_token, remote_launch_spec


async def _ok(_: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


def _client(environ: dict[str, str]) -> httpx.AsyncClient:
    app = require_token(Starlette(routes=[Route("/health", _ok)]), environ)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://worker")


async def test_a_worker_with_a_token_refuses_calls_without_it() -> None:
    token = new_worker_token()
    async with _client({TOKEN_ENV: token}) as client:
        assert (await client.get("/health", headers=auth_headers(token))).status_code == 200
        for headers in ({}, auth_headers("wrong"), {"Authorization": token}):
            refused = await client.get("/health", headers=headers)
            assert refused.status_code == 401
            assert refused.json()["error"]["code"] == "invalid_worker_token"
            assert refused.json()["error"]["type"] == "authentication_error"


async def test_a_worker_without_a_token_is_open_as_before() -> None:
    async with _client({}) as client:
        assert (await client.get("/health")).status_code == 200


def test_a_remote_launch_binds_the_named_interface_and_carries_the_secret() -> None:
    plan = DeploymentPlan(model="m", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
                          context_tokens=512)  # fmt: skip
    local = LlamaCppAdapter().launch_spec(plan, 8123)
    spec = remote_launch_spec(local, "10.0.0.7", "s3cret")
    argv = list(spec.argv)
    assert argv[argv.index("--host") + 1] == "10.0.0.7"
    assert spec.env[TOKEN_ENV] == "s3cret" and "s3cret" not in argv  # never in argv: `ps` shows it to everyone
    assert TOKEN_ENV not in local.env and list(local.argv)[argv.index("--host") + 1] == "127.0.0.1"
    with pytest.raises(ValueError, match="token"):
        remote_launch_spec(local, "10.0.0.7", "")
