"""The real Open WebUI 0.12.4 backend in front of `voltgate serve` on the tiny VLM, driven as its browser does.

Open WebUI is not a test dependency (its install is 2.9 GB with CPU torch, ~12 min): it lives in its own
venv, `VOLTGATE_OPENWEBUI_VENV` (default `~/.cache/voltgate/openwebui-0.12.4`, made by `make openwebui-venv`), and
this test skips, saying so, when that venv is not there. Open WebUI talks to the gateway through the
logging proxy (tests/clients/recorder.py), so what it sent is checked, not assumed: the image reached the
gateway as an `image_url` data URI and was answered 200, the answer streamed back to the browser's socket,
and the title, tags and follow-up tasks ran. Everything is on 127.0.0.1 with Open WebUI's offline settings.
`VOLTGATE_OPENWEBUI_RECORD=FILE.jsonl` keeps the proxy's log (how tests/fixtures/clients/openwebui_recorded_*
were made).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.clients import recorder
from tests.conftest import REPO, free_port
from tests.e2e.conftest import Gateway, model_entry, start_gateway, stop_gateway, write_config
from tests.e2e.test_vision import RED, VLM
from tests.fixtures.vlm.build import vlm_dir

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.openwebui]

VENV = Path(os.environ.get("VOLTGATE_OPENWEBUI_VENV", Path.home() / ".cache/voltgate/openwebui-0.12.4"))
START_TIMEOUT_S = 240
# Open WebUI's built-in tools (36, ~4,700 prompt tokens: minutes of prefill on a loaded 2-core host) are off
# here, by the user setting Function Calling "legacy"; `VOLTGATE_OPENWEBUI_TOOLS="off on"` keeps its default
# (on) for the text message, as the committed recording was made.
TOOLS = os.environ.get("VOLTGATE_OPENWEBUI_TOOLS", "off off").split()
TASKS_TIMEOUT_S = 120
TASK_PROMPTS = ("concise title", "tags categorizing", "Predict 3-5 useful messages")  # Open WebUI's task prompts
ANSWER_TIMEOUT_S = float(os.environ.get("VOLTGATE_OPENWEBUI_ANSWER_TIMEOUT_S", "240"))
# What makes Open WebUI start and run with no internet: no embedding model download (RAG through an
# OpenAI-style engine it never calls here), no version check, no Ollama, HF offline, a fixed secret.
OFFLINE_ENV = {
    "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "RAG_EMBEDDING_ENGINE": "openai",
    "ENABLE_OLLAMA_API": "false", "ENABLE_WEB_SEARCH": "false", "ENABLE_VERSION_UPDATE_CHECK": "false",
    "WEBUI_SECRET_KEY": "voltgate-test-secret-of-32-bytes-or-more", "OPENAI_API_KEY": "x",
    "ANONYMIZED_TELEMETRY": "false", "SCARF_NO_ANALYTICS": "true", "DO_NOT_TRACK": "true",
    "GLOBAL_LOG_LEVEL": "WARNING",
}  # fmt: skip


def _open_webui() -> Path:
    binary = VENV / "bin" / "open-webui"
    if not binary.exists():
        pytest.skip(f"Open WebUI is not installed at {VENV}: `make openwebui-venv` installs it (2.9 GB, ~12 min)")
    return binary


@pytest.fixture(scope="module")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    _open_webui()
    tmp = tmp_path_factory.mktemp("owui-gateway")
    model_dir = vlm_dir(tmp / "vlm", smollm2_path)
    entry = model_entry(model_dir / smollm2_path.name, name=VLM, context=8192, concurrency=2, default_max_tokens=48)
    entry["llamacpp"] = {"n_threads": 2, "max_queue": 64}
    # The title task asks for max_tokens 1000, which SmolLM2 may use up: clamped to what a test needs.
    config = write_config(tmp, smollm2_path, free_port(), models=[entry], max_body_bytes=64 * 1024 * 1024,
                          max_tokens_cap=64, max_tokens_over_cap="clamp")  # fmt: skip
    gw = start_gateway(config, tmp / "gateway.log")
    try:
        gw.wait_ready()
        yield gw
    finally:
        stop_gateway(gw)


@pytest.fixture(scope="module")
def recording(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The logging proxy in front of the gateway: its URL and its JSONL log."""
    out = Path(os.environ.get("VOLTGATE_OPENWEBUI_RECORD") or tmp_path_factory.mktemp("owui-rec") / "rec.jsonl")
    out.unlink(missing_ok=True)
    port = free_port()
    server = recorder.serve(port, gateway.url, out)
    try:
        yield f"http://127.0.0.1:{port}", out
    finally:
        server.shutdown()


@pytest.fixture(scope="module")
def open_webui(recording: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("owui-data")
    port = free_port()
    env = {**os.environ, **OFFLINE_ENV, "DATA_DIR": str(tmp), "OPENAI_API_BASE_URL": recording[0] + "/v1"}
    log = (tmp / "open-webui.log").open("wb")
    argv = [str(_open_webui()), "serve", "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(argv, cwd=tmp, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process, tmp / "open-webui.log")
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


def _drive(url: str, image: Path) -> dict[str, Any]:
    python = VENV / "bin" / "python"
    argv = [str(python), "-m", "tests.clients.openwebui_browser", "--url", url, "--model", VLM, "--image", str(image),
            "--tools", *TOOLS, "--timeout", str(ANSWER_TIMEOUT_S)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=4 * ANSWER_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for m in body.get("messages", []) if isinstance(m.get("content"), list)
            for part in m["content"] if part.get("type") == "image_url"]  # fmt: skip


def test_an_image_attached_in_open_webui_reaches_the_model_and_the_answer_streams_back(
    open_webui: str, recording: tuple[str, Path], gateway: Gateway, tmp_path: Path
) -> None:
    image = tmp_path / "red.png"
    image.write_bytes(RED)
    result = _drive(open_webui, image)
    print("\n" + json.dumps({k: v for k, v in result.items()}, indent=1)[:3000])
    for turn in ("image_turn", "text_turn"):
        assert result[turn]["done"] and not result[turn]["errors"], result[turn]
        assert result[turn]["delta_events"] >= 2  # streamed: the gateway's chunks, one event each
        assert result[turn]["output"], result[turn]  # and the finished message holds the answer
    chats = _chat_requests(recording[1])
    with_image = [e for e in chats if _image_parts(e["body"])]
    assert with_image, [e["body"].get("messages") for e in chats]
    assert all(e["status"] == 200 for e in chats), [(e["status"], e["response"]) for e in chats if e["status"] != 200]
    url = _image_parts(with_image[0]["body"])[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert with_image[0]["body"]["stream"] is True


def _chat_requests(log: Path) -> list[dict[str, Any]]:
    """The proxy's chat requests once Open WebUI's title, tags and follow-up tasks are among them (the proxy
    writes an exchange when it ends, and the tasks run on after the answer)."""
    deadline = time.monotonic() + TASKS_TIMEOUT_S
    while True:
        exchanges = [json.loads(line) for line in log.read_text().splitlines()]
        chats = [e for e in exchanges if e["method"] == "POST" and e["path"] == "/v1/chat/completions"]
        prompts = " ".join(str(e["body"]["messages"][-1]["content"])[:80] for e in chats)
        if all(task in prompts for task in TASK_PROMPTS) or time.monotonic() > deadline:
            assert all(task in prompts for task in TASK_PROMPTS), prompts
            return chats
        time.sleep(1)
