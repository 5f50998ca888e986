"""What the real Open WebUI 0.12.4 sent to voltgate in a chat with an attached image, replayed against
`voltgate serve` on the tiny VLM (SmolLM2 with the test projector, as tests/e2e/test_vision.py serves it).

The requests are tests/fixtures/clients/openwebui_recorded_image_chat.json, recorded through the logging
proxy from Open WebUI's own backend driven as its browser does (tests/e2e/test_open_webui_real.py; how, in
docs/open-webui.md): the image message (an `image_url` data URI part after the text, streamed, no tools: its
Function Calling setting "legacy"), the title, tags and follow-up tasks (not streamed) and the next message
with its default built-in tools. Each must get what Open WebUI reads: an SSE stream of chunks whose first
delta has the role, then text, a `finish_reason` and `[DONE]`; one choice with `message.content` for a task.
The image must reach the model: the recorded image message costs the image's 16 tokens more than itself
without the picture.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.clients.fixtures import load
from tests.clients.recorder import sse_events
from tests.conftest import LONG_PROMPT_KV, LONG_PROMPT_THREADS, free_port
from tests.e2e.conftest import (
    Gateway,
    model_entry,
    running_gateway,
    write_config,
)
from tests.e2e.test_vision import IMAGE_TOKENS, VLM
from tests.fixtures.vlm.build import vlm_dir

pytestmark = pytest.mark.e2e

FIXTURE = load("openwebui_recorded_image_chat")
EXCHANGES: list[dict[str, Any]] = [e for e in FIXTURE["exchanges"] if e["path"] == "/v1/chat/completions"]


def _image_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for m in body["messages"] if isinstance(m["content"], list)
            for part in m["content"] if part["type"] == "image_url"]  # fmt: skip


def _is_task(body: dict[str, Any]) -> bool:
    last = body["messages"][-1]["content"]
    return isinstance(last, str) and last.startswith("### Task:")


IMAGE_MESSAGE = next(e for e in EXCHANGES if _image_parts(e["body"]))
TASKS = [e for e in EXCHANGES if _is_task(e["body"])]
TOOLS_MESSAGE = next(e for e in EXCHANGES if e["body"].get("tools"))


@pytest.fixture(scope="module")
def gateway(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    tmp = tmp_path_factory.mktemp("owui-replay")
    model_dir = vlm_dir(tmp / "vlm", smollm2_path)
    entry = model_entry(model_dir / smollm2_path.name, name=VLM, context=8192, concurrency=2, default_max_tokens=8)
    # the tools' 4k-token prefill
    entry["llamacpp"] = {**entry.get("llamacpp", {}), "n_threads": LONG_PROMPT_THREADS, "cache_type": LONG_PROMPT_KV}
    config = write_config(tmp, smollm2_path, free_port(), models=[entry], max_body_bytes=64 * 1024 * 1024)
    with running_gateway(config, tmp / "gateway.log") as gw:
        yield gw


def replay(gateway: Gateway, body: dict[str, Any]) -> httpx.Response:
    headers = {**IMAGE_MESSAGE["headers"], "authorization": "Bearer x"}
    return httpx.post(gateway.base_url + "/chat/completions", json=body, headers=headers, timeout=600)


def assert_open_webui_stream(response: httpx.Response) -> list[dict[str, Any]]:
    """The chunks Open WebUI's stream handler reads, in the order it needs them."""
    assert response.status_code == 200, response.text[:500]
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content)
    assert events[-1]["data"] == "[DONE]"
    chunks = [e["data"] for e in events[:-1] if isinstance(e.get("data"), dict)]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == VLM for c in chunks)
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[0]["delta"]["role"] == "assistant"
    assert "".join(c["delta"].get("content") or "" for c in choices)
    assert [c["finish_reason"] for c in choices if c["finish_reason"]] == [choices[-1]["finish_reason"]]
    assert choices[-1]["finish_reason"] in ("stop", "length")
    return chunks


def test_the_recorded_image_message_streams_an_answer(gateway: Gateway) -> None:
    body = IMAGE_MESSAGE["body"]
    assert body["stream"] is True and "tools" not in body
    assert _image_parts(body)[0]["image_url"]["url"].startswith("data:image/png;base64,")
    assert_open_webui_stream(replay(gateway, body))


def test_the_recorded_image_reaches_the_model(gateway: Gateway) -> None:
    with_image = {**copy.deepcopy(IMAGE_MESSAGE["body"]), "stream": False, "max_tokens": 1}
    without = copy.deepcopy(with_image)
    for message in without["messages"]:
        if isinstance(message["content"], list):
            message["content"] = [p for p in message["content"] if p["type"] != "image_url"]
    tokens = [replay(gateway, b).json()["usage"]["prompt_tokens"] for b in (with_image, without)]
    assert tokens[0] == tokens[1] + IMAGE_TOKENS


@pytest.mark.parametrize("index", range(len(TASKS)), ids=lambda i: TASKS[i]["body"]["messages"][-1]["content"][10:30])
def test_the_recorded_background_tasks_get_one_message(gateway: Gateway, index: int) -> None:
    body = TASKS[index]["body"]
    assert body["stream"] is False
    response = replay(gateway, body)
    assert response.status_code == 200, response.text[:500]
    reply = response.json()
    assert len(reply["choices"]) == 1 and isinstance(reply["choices"][0]["message"]["content"], str)


@pytest.mark.slow  # the built-in tools' prompt: thousands of tokens of prefill on a CPU
def test_the_recorded_message_with_the_default_tools_streams_an_answer(gateway: Gateway) -> None:
    body = TOOLS_MESSAGE["body"]
    assert body["stream"] is True and "tool_choice" not in body and len(body["tools"]) >= 20
    assert_open_webui_stream(replay(gateway, body))
