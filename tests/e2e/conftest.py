"""`voltgate serve` as a real subprocess on a free port, serving the real SmolLM2 GGUF via the real worker."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from tests.conftest import REPO, free_port

MODEL = "smollm2-135m"
DEFAULT_MAX_TOKENS = 40  # the test model's default_max_tokens
READY_TIMEOUT_S = 180


@dataclass
class Gateway:
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.base_url, api_key=str(kwargs.pop("api_key", "unused")), max_retries=0, timeout=120, **kwargs
        )  # type: ignore[arg-type]

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"gateway exited:\n{self.log()[-3000:]}"
            try:
                if httpx.get(self.url + "/ready", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise AssertionError(f"gateway not ready in {timeout_s} s:\n{self.log()[-3000:]}")


def model_entry(model_path: Path, name: str = MODEL, **overrides: object) -> dict[str, object]:
    """One SmolLM2 model entry for a test config; `overrides` replace top-level keys (e.g. concurrency)."""
    entry: dict[str, object] = {
        "name": name,
        "aliases": ["smollm2"] if name == MODEL else [],
        "sources": [{"gguf": str(model_path)}],
        "context": 4096,  # room for what chat frontends send (Open WebUI: ~30 tool definitions per chat)
        "concurrency": 4,
        "default_max_tokens": DEFAULT_MAX_TOKENS,
        "llamacpp": {"n_threads": 1, "max_queue": 64},
    }
    entry.update(overrides)
    return entry


def write_config(
    tmp: Path,
    model_path: Path,
    port: int,
    *,
    models: list[dict[str, object]] | None = None,
    auth: dict[str, object] | None = None,
    **server: object,
) -> Path:
    """A config serving SmolLM2 on the CPU; `models`/`auth` replace those sections, `server` adds settings."""
    config: dict[str, object] = {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "max_body_bytes": 65536,
            "queue_timeout_s": 60,
            "data_dir": str(tmp / "data"),
            **server,
        },
        "gpus": "none",
        "models": models if models is not None else [model_entry(model_path)],
    }
    if auth is not None:
        config["auth"] = auth
    path = tmp / "voltgate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def start_gateway(config: Path, log_path: Path, env: dict[str, str] | None = None, args: Sequence[str] = ()) -> Gateway:
    """Start `voltgate serve` (extra CLI `args`, e.g. `--log-format json`), its output going to `log_path`."""
    port = yaml.safe_load(config.read_text())["server"]["port"]
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), *args],
        cwd=REPO,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        start_new_session=True,
    )
    return Gateway(f"http://127.0.0.1:{port}", process, log_path)


@contextlib.contextmanager
def running_gateway(
    config: Path,
    log_path: Path,
    env: dict[str, str] | None = None,
    args: Sequence[str] = (),
    *,
    ready_s: float = READY_TIMEOUT_S,
) -> Iterator[Gateway]:
    """`start_gateway`, ready to serve within `ready_s` (every pinned model's worker up), stopped however the
    block ends: the one harness every test that needs a running `voltgate serve` uses."""
    gw = start_gateway(config, log_path, env, args)
    try:
        gw.wait_ready(ready_s)
        yield gw
    finally:
        stop_gateway(gw)


def stop_gateway(gateway: Gateway) -> None:
    if gateway.process.poll() is None:
        gateway.process.terminate()
        try:
            gateway.process.wait(30)
        except subprocess.TimeoutExpired:
            gateway.process.kill()
            gateway.process.wait()


@pytest.fixture(scope="session")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("gateway")
    with running_gateway(write_config(tmp, smollm2_path, free_port()), tmp / "gateway.log") as gw:
        yield gw
