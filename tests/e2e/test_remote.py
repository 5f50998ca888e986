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
from tests.e2e.conftest import Gateway, running_gateway, write_config

pytestmark = pytest.mark.e2e


class Upstream:
    """The real llama.cpp worker standing for another host's endpoint: `start()` again after a kill serves on the
    same port, as a host that came back would."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._model, self._log = model, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        argv = [sys.executable, "-m", "backends.llamacpp.worker", "--model", str(self._model),
                "--model-name", "smol-on-gpu-2", "--port", str(self.port),
                "--ctx", "512", "--slots", "2", "--n-threads", "1"]  # fmt: skip
        self.process = subprocess.Popen(argv, cwd=REPO, stdout=self._log.open("ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/v1/models", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError("the upstream worker did not start")

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def upstream(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    served = Upstream(smollm2_path, tmp_path_factory.mktemp("upstream") / "worker.log")
    served.start()
    yield served
    served.kill()


@pytest.fixture(scope="module")
def fronted(upstream: Upstream, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    url = upstream.url
    tmp = tmp_path_factory.mktemp("remote")
    model = {"name": "team-small", "sources": [{"remote": url + "/v1", "model": "smol-on-gpu-2"}], "concurrency": 2}
    with running_gateway(
        write_config(tmp, smollm2_path, free_port(), models=[model]), tmp / "gateway.log", ready_s=60
    ) as gateway:
        yield gateway


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


def test_an_endpoint_that_goes_away_gives_503_not_a_hang(fronted: Gateway, upstream: Upstream) -> None:
    upstream.kill()
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


def test_an_endpoint_that_answers_again_is_served_again_within_the_bound(fronted: Gateway, upstream: Upstream) -> None:
    """After more failed checks than a local model's crash limit, it is not given up on (docs/lifecycle.md: READY
    within 10 s of the endpoint answering again)."""
    upstream.kill()  # already down after the test above; down for good when run alone
    time.sleep(8)  # several failed checks (1, 2, 4 s apart)
    assert httpx.get(fronted.url + "/ready", timeout=5).status_code == 503
    upstream.start()
    answered = time.monotonic()
    while httpx.get(fronted.url + "/ready", timeout=5).status_code != 200:
        assert time.monotonic() - answered < 12, "not ready again within the bound"
        time.sleep(0.2)
    reply = fronted.client().chat.completions.create(
        model="team-small", messages=[{"role": "user", "content": "Say hi"}], max_tokens=2
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 2
