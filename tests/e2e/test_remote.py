"""A `remote` source: the gateway fronts an OpenAI endpoint already running elsewhere (here: the real
llama.cpp worker started by the test, standing for another host) under its own model name."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import REPO, free_port
from tests.e2e.conftest import Gateway, start_gateway, stop_gateway, write_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def upstream(
    smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    log = (tmp_path_factory.mktemp("upstream") / "worker.log").open("wb")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "backends.llamacpp.worker",
            "--model",
            str(smollm2_path),
            "--model-name",
            "smol-on-gpu-2",
            "--port",
            str(port),
            "--ctx",
            "512",
            "--slots",
            "2",
            "--n-threads",
            "1",
        ],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield process, url
    process.kill()
    process.wait()


@pytest.fixture(scope="module")
def fronted(
    upstream: tuple[subprocess.Popen[bytes], str], smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    _, url = upstream
    tmp = tmp_path_factory.mktemp("remote")
    model = {"name": "team-small", "sources": [{"remote": url + "/v1", "model": "smol-on-gpu-2"}], "concurrency": 2}
    gateway = start_gateway(write_config(tmp, smollm2_path, free_port(), models=[model]), tmp / "gateway.log")
    try:
        gateway.wait_ready(60)
        yield gateway
    finally:
        stop_gateway(gateway)


def test_requests_reach_the_remote_endpoint_under_its_own_model_name(fronted: Gateway) -> None:
    client = fronted.client()
    assert [m.id for m in client.models.list().data] == ["team-small"]
    reply = client.chat.completions.create(
        model="team-small", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 4
    chunks = list(
        client.chat.completions.create(
            model="team-small",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    placement = httpx.get(fronted.base_url + "/placement", timeout=5).json()
    assert "remote" in str(placement)


def test_an_endpoint_that_goes_away_gives_503_not_a_hang(
    fronted: Gateway, upstream: tuple[subprocess.Popen[bytes], str]
) -> None:
    process, _ = upstream
    process.kill()
    process.wait()
    with pytest.raises(openai.InternalServerError) as info:
        fronted.client().chat.completions.create(
            model="team-small", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert info.value.status_code == 503
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and httpx.get(fronted.url + "/ready", timeout=5).status_code == 200:
        time.sleep(0.2)
    ready = httpx.get(fronted.url + "/ready", timeout=5)
    assert ready.status_code == 503
    assert ready.json()["models"]["team-small"]["state"] == "failed"
