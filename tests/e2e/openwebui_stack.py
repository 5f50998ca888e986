"""The stack the Open WebUI tests start: `voltgate serve` on the tiny VLM (or on a thinking SmolLM2), the logging
proxy, `open-webui serve`.

Open WebUI is not a test dependency (its install is 2.9 GB with CPU torch, ~12 min): it lives in its own
venv, `VOLTGATE_OPENWEBUI_VENV` (default `~/.cache/voltgate/openwebui-0.12.4`, made by `make openwebui-venv`),
and `open_webui_binary()` skips the test, saying so, when that venv is not there. Open WebUI talks to the
gateway through the logging proxy (tests/clients/recorder.py), so what it sent can be checked, not assumed.
Everything is on 127.0.0.1 with Open WebUI's offline settings. `openwebui_stack` starts the three in order
(each test module's one fixture, with its gateway as a parameter); `drive` runs the browser's code against it.
Used by tests/e2e/test_open_webui_real.py (the backend driven as its browser's code does),
tests/e2e/test_open_webui_reasoning.py (the same, on a thinking model) and tests/e2e/test_open_webui_browser.py
(its real UI in headless chromium).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.clients import recorder
from tests.conftest import REPO, free_port
from tests.e2e.conftest import Gateway, model_entry, running_gateway, write_config
from tests.e2e.test_vision import VLM
from tests.fixtures.gguf_templates import thinking_gguf
from tests.fixtures.vlm.build import vlm_dir

VENV = Path(os.environ.get("VOLTGATE_OPENWEBUI_VENV", Path.home() / ".cache/voltgate/openwebui-0.12.4"))
START_TIMEOUT_S = 240
ANSWER_TIMEOUT_S = float(os.environ.get("VOLTGATE_OPENWEBUI_ANSWER_TIMEOUT_S", "240"))  # each answer, in `drive`
# What makes Open WebUI start and run with no internet: no embedding model download (RAG through an
# OpenAI-style engine it never calls here), no version check, no Ollama, HF offline, a fixed secret.
OFFLINE_ENV = {
    "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAG_EMBEDDING_ENGINE": "openai",
    "ENABLE_OLLAMA_API": "false", "ENABLE_WEB_SEARCH": "false", "ENABLE_VERSION_UPDATE_CHECK": "false",
    "WEBUI_SECRET_KEY": "voltgate-test-secret-of-32-bytes-or-more", "OPENAI_API_KEY": "x",
    "ANONYMIZED_TELEMETRY": "false", "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true",
    "GLOBAL_LOG_LEVEL": "WARNING",
}  # fmt: skip
CHAT_PATH = "/v1/chat/completions"
THINKING = "smol-thinking"  # the model of `thinking_gateway`
TASK_PROMPTS = ("concise title", "tags categorizing", "Predict 3-5 useful messages")  # Open WebUI's task prompts


@dataclass(frozen=True)
class Stack:
    """A running `openwebui_stack`."""

    gateway: Gateway
    log: Path  # the proxy's JSONL log of what Open WebUI sent and what it got back
    url: str  # Open WebUI's


@contextmanager
def openwebui_stack(
    gateway: Callable[[Path], AbstractContextManager[Gateway]],
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *,
    record: Path | None = None,
) -> Iterator[Stack]:
    """The gateway `gateway(folder)` starts (`vlm_gateway`, `thinking_gateway`), the logging proxy in front of it
    (its log at `record`, else in a folder of its own) and `open-webui serve` talking to the proxy, stopped in the
    reverse order; the temporary folders are named after `name`. Skips first, before anything starts, when the
    Open WebUI venv is missing."""
    open_webui_binary()
    with gateway(tmp_path_factory.mktemp(f"{name}-gateway")) as gw:
        log = record or tmp_path_factory.mktemp(f"{name}-rec") / "rec.jsonl"
        data_dir = tmp_path_factory.mktemp(f"{name}-data")
        with recording_proxy(gw, log) as proxy, open_webui_server(proxy, data_dir) as url:
            yield Stack(gw, log, url)


def drive(url: str, model: str, *, image: Path | None = None, tools: Sequence[str] = ("off", "off")) -> dict[str, Any]:
    """Open WebUI at `url` driven as its browser's code does (tests/clients/openwebui_browser.py, under the Open
    WebUI venv's Python): a message with `image` then a text one, or the text one alone; `tools` ("on"/"off"
    for each) its built-in tools. What the driver saw, as it prints it."""
    argv = [str(VENV / "bin" / "python"), "-m", "tests.clients.openwebui_browser", "--url", url, "--model", model,
            *(["--image", str(image)] if image is not None else []),
            "--tools", *tools, "--timeout", str(ANSWER_TIMEOUT_S)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=4 * ANSWER_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def open_webui_binary() -> Path:
    """`open-webui` of the Open WebUI venv; skips the test when that venv is missing."""
    binary = VENV / "bin" / "open-webui"
    if not binary.exists():
        pytest.skip(f"Open WebUI is not installed at {VENV}: `make openwebui-venv` installs it (2.9 GB, ~12 min)")
    return binary


@contextmanager
def vlm_gateway(smollm2_path: Path, tmp: Path, *, thinking: bool = False) -> Iterator[Gateway]:
    """`voltgate serve` on the tiny VLM (SmolLM2 with the random-weight projector), and with `thinking` the thinking
    SmolLM2 of `thinking_gateway` beside it, ready."""
    model_dir = vlm_dir(tmp / "vlm", smollm2_path)
    entry = model_entry(model_dir / smollm2_path.name, name=VLM, context=8192, concurrency=2, default_max_tokens=48)
    entry["llamacpp"] = {"n_threads": 2, "max_queue": 64}
    models = [entry, _thinking_entry(smollm2_path, tmp)] if thinking else [entry]
    # The title task asks for max_tokens 1000, which SmolLM2 may use up: clamped to what a test needs.
    config = write_config(tmp, smollm2_path, free_port(), models=models, max_body_bytes=64 * 1024 * 1024,
                          max_tokens_cap=64, max_tokens_over_cap="clamp")  # fmt: skip
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


def _thinking_entry(smollm2_path: Path, tmp: Path) -> dict[str, object]:
    """SmolLM2 under a thinking Qwen3 template (`THINKING`), with a thinking budget that closes the thinking, and
    greedy: sampled, SmolLM2 sometimes ended inside its thinking (`<|im_end|>` after 4 tokens) with no answer to
    show, as greedy does on "Say hello in one sentence."; on the tests' prompt it thinks to the budget, then
    answers."""
    gguf = thinking_gguf(smollm2_path, tmp / "smollm2-qwen3-thinking.gguf")
    entry = model_entry(gguf, name=THINKING, context=8192, concurrency=2, default_max_tokens=48,
                        reasoning={"effort": "high", "budget_tokens": 8},
                        sampling={"temperature": 0.0, "repetition_penalty": 1.1})  # fmt: skip
    entry["llamacpp"] = {"n_threads": 2, "max_queue": 64}
    return entry


@contextmanager
def thinking_gateway(smollm2_path: Path, tmp: Path) -> Iterator[Gateway]:
    """`voltgate serve` on the thinking SmolLM2 alone (`_thinking_entry`), ready."""
    models = [_thinking_entry(smollm2_path, tmp)]
    config = write_config(tmp, smollm2_path, free_port(), models=models, max_tokens_cap=96, max_tokens_over_cap="clamp")
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


@contextmanager
def recording_proxy(gateway: Gateway, out: Path) -> Iterator[str]:
    """The logging proxy in front of the gateway, writing its JSONL log to `out`: its URL."""
    out.unlink(missing_ok=True)
    port = free_port()
    server = recorder.serve(port, gateway.url, out)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.shutdown()


@contextmanager
def open_webui_server(openai_url: str, data_dir: Path) -> Iterator[str]:
    """`open-webui serve` on loopback, offline, with `openai_url` (the proxy) as its OpenAI connection."""
    port = free_port()
    env = {**os.environ, **OFFLINE_ENV, "DATA_DIR": str(data_dir), "OPENAI_API_BASE_URL": openai_url + "/v1"}
    log_path = data_dir / "open-webui.log"
    argv = [str(open_webui_binary()), "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, cwd=data_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, log_path)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, f"Open WebUI exited:\n{log.read_text(errors='replace')[-3000:]}"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"Open WebUI not healthy in {START_TIMEOUT_S} s:\n{log.read_text(errors='replace')[-3000:]}")


def exchanges(log: Path) -> list[dict[str, Any]]:
    """The proxy's exchanges so far (each written when it ended)."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def chat_requests(log: Path) -> list[dict[str, Any]]:
    return [e for e in exchanges(log) if e["method"] == "POST" and e["path"] == CHAT_PATH]


def chat_requests_with_tasks(log: Path, timeout_s: float) -> list[dict[str, Any]]:
    """The proxy's chat requests once Open WebUI's title, tags and follow-up tasks are among them (the proxy
    writes an exchange when it ends, and the tasks run on after the answer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        chats = chat_requests(log)
        prompts = " ".join(str(e["body"]["messages"][-1]["content"])[:80] for e in chats)
        if all(task in prompts for task in TASK_PROMPTS) or time.monotonic() > deadline:
            assert all(task in prompts for task in TASK_PROMPTS), prompts
            return chats
        time.sleep(1)


def image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The `image_url` parts of a chat request's messages."""
    return [part for m in body.get("messages", []) if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == "image_url"]  # fmt: skip


def streamed_text(exchange: dict[str, Any]) -> str:
    """The answer text a streamed chat exchange carried: its chunks' `delta.content`, joined."""
    events = exchange["response"] if isinstance(exchange["response"], list) else []
    return "".join(
        choice.get("delta", {}).get("content") or ""
        for event in events
        if isinstance(event.get("data"), dict)
        for choice in event["data"].get("choices", [])
    )
