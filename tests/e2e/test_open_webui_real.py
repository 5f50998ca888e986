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
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from tests.e2e.openwebui_stack import Stack, chat_requests_with_tasks, drive, image_parts, openwebui_stack, vlm_gateway
from tests.e2e.test_vision import RED, VLM

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.openwebui]

# Open WebUI's built-in tools (36, ~4,700 prompt tokens: minutes of prefill on a loaded 2-core host) are off
# here, by the user setting Function Calling "legacy"; `VOLTGATE_OPENWEBUI_TOOLS="off on"` keeps its default
# (on) for the text message, as the committed recording was made.
TOOLS = os.environ.get("VOLTGATE_OPENWEBUI_TOOLS", "off off").split()
TASKS_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def stack(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    record = os.environ.get("VOLTGATE_OPENWEBUI_RECORD")
    gateway = partial(vlm_gateway, smollm2_path)
    with openwebui_stack(gateway, tmp_path_factory, "owui", record=Path(record) if record else None) as running:
        yield running


def test_an_image_attached_in_open_webui_reaches_the_model_and_the_answer_streams_back(
    stack: Stack, tmp_path: Path
) -> None:
    image = tmp_path / "red.png"
    image.write_bytes(RED)
    result = drive(stack.url, VLM, image=image, tools=TOOLS)
    print("\n" + json.dumps({k: v for k, v in result.items()}, indent=1)[:3000])
    for turn in ("image_turn", "text_turn"):
        assert result[turn]["done"] and not result[turn]["errors"], result[turn]
        assert result[turn]["delta_events"] >= 2  # streamed: the gateway's chunks, one event each
        assert result[turn]["output"], result[turn]  # and the finished message holds the answer
    chats = chat_requests_with_tasks(stack.log, TASKS_TIMEOUT_S)
    with_image = [e for e in chats if image_parts(e["body"])]
    assert with_image, [e["body"].get("messages") for e in chats]
    assert all(e["status"] == 200 for e in chats), [(e["status"], e["response"]) for e in chats if e["status"] != 200]
    url = image_parts(with_image[0]["body"])[0]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert with_image[0]["body"]["stream"] is True
