"""Browser frontends on another origin: CORS only when `server.cors_origins` lists that origin."""

from __future__ import annotations

import httpx

from gateway.app import create_app
from gateway.config import Config


def config(origins: tuple[str, ...]) -> Config:
    return Config.model_validate(
        {"server": {"cors_origins": origins}, "models": [{"name": "m", "sources": [{"gguf": "/nonexistent.gguf"}]}]}
    )


async def preflight(origins: tuple[str, ...], origin: str) -> httpx.Response:
    app = create_app(config(origins), plans=[])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as client:
        return await client.options(
            "/v1/chat/completions",
            headers={"origin": origin, "access-control-request-method": "POST"},
        )


async def test_listed_origin_gets_cors_headers() -> None:
    response = await preflight(("https://chat.example",), "https://chat.example")
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "https://chat.example"


async def test_no_cors_by_default() -> None:
    response = await preflight((), "https://chat.example")
    assert "access-control-allow-origin" not in response.headers
