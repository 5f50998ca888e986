"""Right after `serving on ...`: a request for a pinned model that is still loading waits for it (no 503), and
a worker that crashes on every request ends as a failed model naming the signal, not a silent restart loop.

The model is served through the `lmdeploy` stand-in (tests/fakes/standin_bin/lmdeploy) because TurboMind
needs a GPU: it sleeps `VOLTGATE_STANDIN_LOAD_S` first (TurboMind takes 15-20 s to load a 7B) and then runs
the real llama.cpp worker on the real SmolLM2 GGUF; with `VOLTGATE_STANDIN_SEGV` it runs a fake worker that
dies by a real SIGSEGV on every request instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import REPO, free_port
from tests.e2e.conftest import Gateway, start_gateway, stop_gateway
from tests.e2e.test_lmdeploy_standin import SMOLLM2_135M
from tests.unit.placement_models import write_hf_model

pytestmark = pytest.mark.e2e
MODEL = "smollm2-turbomind"
LOAD_S = 6


def _start(tmp: Path, smollm2_path: Path, **env: str) -> Gateway:
    hf_dir = write_hf_model(tmp / "SmolLM2-135M-Instruct", SMOLLM2_135M, dtype="BF16")
    config = {
        "server": {"host": "127.0.0.1", "port": free_port(), "keepalive_interval_s": 1, "data_dir": str(tmp)},
        "gpus": "v100-16gb",
        "models": [{"name": MODEL, "sources": [{"hf": str(hf_dir)}], "context": 2048, "concurrency": 4}],
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    path = os.pathsep.join([str(REPO / "tests" / "fakes" / "standin_bin"), os.path.dirname(sys.executable)])
    return start_gateway(
        tmp / "config.yaml", tmp / "gateway.log",
        env={"PATH": f"{path}{os.pathsep}{os.environ['PATH']}", "VOLTGATE_STANDIN_GGUF": str(smollm2_path),
             "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip


def _wait_serving(gateway: Gateway) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert gateway.process.poll() is None, gateway.log()[-3000:]
        try:
            if httpx.get(gateway.url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.05)
    raise AssertionError(f"gateway never served:\n{gateway.log()[-3000:]}")


@pytest.fixture
def booting(smollm2_path: Path, tmp_path: Path) -> Iterator[Gateway]:
    gateway = _start(tmp_path, smollm2_path, VOLTGATE_STANDIN_LOAD_S=str(LOAD_S))
    try:
        _wait_serving(gateway)
        yield gateway
    finally:
        stop_gateway(gateway)


def test_the_first_request_waits_for_a_pinned_model_that_is_still_loading(booting: Gateway) -> None:
    ready = httpx.get(booting.url + "/ready", timeout=5)
    assert ready.status_code == 503  # the model is still loading: this request really came first
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Say hi"}]}
    started = time.monotonic()
    reply = httpx.post(booting.base_url + "/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["role"] == "assistant"
    assert time.monotonic() - started > 1  # it waited for the load rather than being refused


def test_a_stream_sent_while_loading_gets_keepalives_then_its_answer(booting: Gateway) -> None:
    body = {"model": MODEL, "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    with httpx.stream("POST", booting.base_url + "/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        lines = list(response.iter_lines())
    assert any(line.startswith(":") and "loading" in line for line in lines), lines[:5]
    assert lines[-1] == "data: [DONE]" or lines[-2] == "data: [DONE]", lines[-5:]
    frames = [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: {")]
    assert not [frame for frame in frames if "error" in frame], lines  # an error event, not the word in a text


def test_a_worker_that_segfaults_on_every_request_ends_failed_with_the_cause(
    smollm2_path: Path, tmp_path: Path
) -> None:
    gateway = _start(tmp_path, smollm2_path, VOLTGATE_STANDIN_SEGV="1")
    try:
        gateway.wait_ready()
        replies = _crash_until_failed(gateway)
        error = replies[-1].json()["error"]
        assert "SIGSEGV" in error["message"] and error["code"] == "worker_unavailable"
        ready = httpx.get(gateway.url + "/ready", timeout=5).json()
        assert ready["models"][MODEL]["state"] == "failed"
        assert "SIGSEGV" in ready["models"][MODEL]["error"]
        listed = httpx.get(gateway.base_url + "/models", timeout=5).json()
        entry = next(m for m in listed["data"] if m["id"] == MODEL)
        assert entry["status"] == "failed" and "SIGSEGV" in entry["status_reason"]
        placement = httpx.get(gateway.base_url + "/placement", timeout=5).json()
        live = next(d for d in placement["decisions"] if d["model"] == MODEL)["live"]
        assert live["status"] == "failed" and "SIGSEGV" in live["error"]
        metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
        assert f'voltgate:worker_crashes_total{{cause="SIGSEGV",model="{MODEL}"}} 3.0' in metrics
        time.sleep(3)  # no restart behind the scenes: the count stays
        metrics = httpx.get(gateway.url + "/metrics", timeout=5).text
        assert f'voltgate:worker_crashes_total{{cause="SIGSEGV",model="{MODEL}"}} 3.0' in metrics
        reload = httpx.post(gateway.url + "/admin/reload", timeout=60)  # a config reload tries again
        assert reload.status_code == 200 and reload.json()["unchanged"] == [MODEL], reload.text
        gateway.wait_ready(60)
        _crash_until_failed(gateway)
        again = httpx.post(gateway.url + f"/admin/models/{MODEL}/load", timeout=60)
        assert again.status_code == 200, again.text  # an admin load tries again: the worker starts
        assert httpx.get(gateway.url + "/ready", timeout=5).json()["models"][MODEL]["state"] == "ready"
    finally:
        stop_gateway(gateway)


def _crash_until_failed(gateway: Gateway) -> list[httpx.Response]:
    """Requests until the model is failed: each kills the worker (a 503 for the lost connection, or one
    that waited for a restart that crashed again), the last names the crash loop."""
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    replies = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        reply = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=60)
        replies.append(reply)
        assert reply.status_code == 503, reply.text
        if "voltgate doctor" in reply.text:
            return replies
    raise AssertionError([r.text for r in replies])
