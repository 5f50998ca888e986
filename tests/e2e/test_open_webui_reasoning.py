"""The real Open WebUI 0.12.4 backend on a thinking model: the thinking shows as Open WebUI's reasoning block, the
answer as the message, and no `<think>` tag reaches either (issue 36).

The stack of tests/e2e/test_open_webui_real.py (skipped, saying how to make it, when the Open WebUI venv is
missing), with the gateway on SmolLM2 under a thinking Qwen3 template (`openwebui_stack.thinking_gateway`: the
generation prompt opens `<think>`, as the Qwen3 "Thinking" models' and Qwen3.5's do). Open WebUI is driven as its
browser's code does (tests/clients/openwebui_browser.py, one text message in a new chat, its default settings but
Function Calling "legacy": its built-in tools are minutes of prefill on a 2-core host); the logging proxy shows
what the gateway sent it.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.openwebui_stack import (
    THINKING,
    Stack,
    chat_requests,
    drive,
    openwebui_stack,
    streamed_text,
    thinking_gateway,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.openwebui]

TAGS = ("<think>", "</think>")
PROMPT = "Explain in two sentences why the sky is blue."  # the driver's TEXT_PROMPT (runs under Open WebUI's Python)


@pytest.fixture(scope="module")
def stack(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with openwebui_stack(partial(thinking_gateway, smollm2_path), tmp_path_factory, "owui-thinking") as running:
        yield running


def _text(item: dict[str, Any]) -> str:
    return "".join(part.get("text") or "" for part in item.get("content") or [])


def test_open_webui_shows_the_thinking_as_its_reasoning_block_and_the_answer_apart(stack: Stack) -> None:
    result = drive(stack.url, THINKING)
    turn = result["text_turn"]
    assert turn["done"] and not turn["errors"], turn
    output = turn["output"] or result["stored_output"] or []
    kinds = [item.get("type") for item in output]
    assert "reasoning" in kinds and "message" in kinds, output
    assert kinds.index("reasoning") < kinds.index("message"), kinds
    reasoning = _text(output[kinds.index("reasoning")])
    answer = _text(output[kinds.index("message")])
    assert reasoning.strip() and answer.strip(), output
    for text in (reasoning, answer, result["stored_content"] or ""):
        assert not any(tag in text for tag in TAGS), text
    # The chat as saved (what the page shows on reload): the answer as the message's content, the thinking kept
    # as its own output item (Open WebUI 0.12 renders that item as the collapsible "Thought for ..." block).
    assert (result["stored_content"] or "").strip() == answer.strip(), result["stored_content"]
    saved = [item.get("type") for item in result["stored_output"] or []]
    assert "reasoning" in saved and saved.index("reasoning") < saved.index("message"), result["stored_output"]

    (chat,) = [
        e
        for e in chat_requests(stack.log)
        if e["body"]["model"] == THINKING and e["body"]["stream"] and e["body"]["messages"][-1]["content"] == PROMPT
    ]  # the message (not its title and tags tasks)
    assert chat["status"] == 200
    deltas = [choice.get("delta", {}) for event in chat["response"] if isinstance(event.get("data"), dict)
              for choice in event["data"].get("choices", [])]  # fmt: skip
    assert any(d.get("reasoning_content") for d in deltas), deltas[:5]  # what Open WebUI read the thinking from
    assert not any(tag in streamed_text(chat) for tag in TAGS)
