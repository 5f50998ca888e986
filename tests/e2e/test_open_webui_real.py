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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.e2e.conftest import Gateway
from tests.e2e.openwebui_stack import (
    VENV,
    chat_requests_with_tasks,
    image_parts,
    open_webui_binary,
    open_webui_server,
    recording_proxy,
    vlm_gateway,
)
from tests.e2e.test_vision import RED, VLM

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.openwebui]

# Open WebUI's built-in tools (36, ~4,700 prompt tokens: minutes of prefill on a loaded 2-core host) are off
# here, by the user setting Function Calling "legacy"; `VOLTGATE_OPENWEBUI_TOOLS="off on"` keeps its default
# (on) for the text message, as the committed recording was made.
TOOLS = os.environ.get("VOLTGATE_OPENWEBUI_TOOLS", "off off").split()
TASKS_TIMEOUT_S = 120
ANSWER_TIMEOUT_S = float(os.environ.get("VOLTGATE_OPENWEBUI_ANSWER_TIMEOUT_S", "240"))


@pytest.fixture(scope="module")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    open_webui_binary()
    with vlm_gateway(smollm2_path, tmp_path_factory.mktemp("owui-gateway")) as gw:
        yield gw


@pytest.fixture(scope="module")
def recording(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The logging proxy in front of the gateway: its URL and its JSONL log."""
    out = Path(os.environ.get("VOLTGATE_OPENWEBUI_RECORD") or tmp_path_factory.mktemp("owui-rec") / "rec.jsonl")
    with recording_proxy(gateway, out) as url:
        yield url, out


@pytest.fixture(scope="module")
def open_webui(recording: tuple[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with open_webui_server(recording[0], tmp_path_factory.mktemp("owui-data")) as url:
        yield url


def _drive(url: str, image: Path) -> dict[str, Any]:
    python = VENV / "bin" / "python"
    argv = [str(python), "-m", "tests.clients.openwebui_browser", "--url", url, "--model", VLM, "--image", str(image),
            "--tools", *TOOLS, "--timeout", str(ANSWER_TIMEOUT_S)]  # fmt: skip
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=4 * ANSWER_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


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
    chats = chat_requests_with_tasks(recording[1], TASKS_TIMEOUT_S)
    with_image = [e for e in chats if image_parts(e["body"])]
    assert with_image, [e["body"].get("messages") for e in chats]
    assert all(e["status"] == 200 for e in chats), [(e["status"], e["response"]) for e in chats if e["status"] != 200]
    url = image_parts(with_image[0]["body"])[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert with_image[0]["body"]["stream"] is True
