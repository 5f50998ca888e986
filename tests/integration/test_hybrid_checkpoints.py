"""Context checkpoints on the real worker (`checkpoints`): prefix reuse for hybrid models, whose recurrent
state llama.cpp cannot cut back.

Each tiny random-weight hybrid (Granite-4.0-H's Mamba2 + attention, Qwen3-Next's gated delta nets +
attention) serves an agent-like session in one slot: turn 2 is turn 1's prompt, the answer rendered
differently, and a new question, so the shared prefix ends inside the slot's cached tokens. With
checkpoints the worker restores the recurrent state saved a few tokens before turn 1's end and prefills only
the rest; the greedy answer must be the one a worker without checkpoints gives from a full prefill (which
proves the restored state right). With `--ctx-checkpoints 0` every turn is prefilled whole, as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.integration.test_hybrid_memory import LAYOUTS, Layout
from tests.integration.test_llamacpp_worker import MODEL, Worker
from tests.integration.test_prompt_cache_worker import running

pytestmark = pytest.mark.integration

ANSWER_TOKENS = 40
TAIL = 4  # checkpoints.TAIL: the checkpoint a turn-2 prompt restores lies this far before turn 1's end


@pytest.fixture(scope="module", params=sorted(LAYOUTS))
def hybrid(request: pytest.FixtureRequest, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    layout: Layout = LAYOUTS[request.param]
    return layout.write(smollm2_path, tmp_path_factory.mktemp("ckpt") / f"tiny-{request.param}.gguf")


def complete(worker: Worker, prompt: str) -> tuple[str, int, int]:
    """The greedy completion of `prompt`: its text, prompt tokens and cached prompt tokens."""
    body: dict[str, Any] = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": ANSWER_TOKENS,
        "temperature": 0,
        "seed": 7,
        "ignore_eos": True,
    }
    response = httpx.post(f"{worker.url}/v1/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["usage"]["completion_tokens"] == ANSWER_TOKENS
    usage = reply["usage"]
    return reply["choices"][0]["text"], usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"]


def turn1() -> str:
    notes = " ".join(f"Step {i}: open file number {i} and read line {i * 3 % 17}." for i in range(24))
    return f"System: you are a coding agent. Tools: read, write, run.\nUser: {notes}\nAssistant:"


def turn2(answer: str) -> str:
    """Turn 1's prompt, the answer re-rendered (as a chat template does), then the next question."""
    return f"{turn1()} <answer>{answer.strip()}</answer>\nUser: now run the tests.\nAssistant:"


@pytest.fixture(scope="module")
def cold(hybrid: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    with running(hybrid, tmp_path_factory.mktemp("cold"), "--ctx-checkpoints", "0") as worker:
        yield worker


def test_turn_two_restores_a_checkpoint_and_answers_as_a_full_prefill(
    hybrid: Path, cold: Worker, tmp_path: Path
) -> None:
    with running(hybrid, tmp_path) as worker:
        answer, n1, cached1 = complete(worker, turn1())
        assert cached1 == 0
        text2, n2, cached2 = complete(worker, turn2(answer))
        assert n1 - TAIL - 2 <= cached2 <= n1 - TAIL  # the checkpoint before turn 1's end (tokenizer joins)
        assert cached2 > n2 // 2  # most of the prompt
        text3, n3, cached3 = complete(worker, turn2(answer))  # the same prompt again: its own checkpoint
        assert (n3, cached3) == (n2, n2 - TAIL)
        points = worker.health()["checkpoints"]
        assert points["restored_total"] == 2 and points["restored_tokens_total"] == cached2 + cached3
        assert 0 < points["entries"] <= 8 and points["bytes"] > 0
    cold_answer, _, _ = complete(cold, turn1())
    assert cold_answer == answer
    # each turn's answer from a full prefill (the cold worker prefills everything, as before checkpoints)
    cold_text, cold_n2, cold_cached = complete(cold, turn2(answer))
    assert (cold_n2, cold_cached) == (n2, 0)
    assert text2 == cold_text
    assert text3 == cold_text


def test_without_checkpoints_every_turn_is_a_full_prefill(cold: Worker) -> None:
    answer, _, _ = complete(cold, turn1())
    assert [complete(cold, turn2(answer))[2] for _ in range(2)] == [0, 0]
    points = cold.health()["checkpoints"]
    assert (points["limit"], points["entries"], points["saved_total"], points["restored_total"]) == (0, 0, 0, 0)


def test_a_prefix_restored_from_host_memory_is_cut_back_to_its_checkpoint(
    hybrid: Path, cold: Worker, tmp_path: Path
) -> None:
    """One slot: another prompt overwrites turn 1 (its state goes to host memory with its checkpoints), then
    turn 2 loads it back and cuts it at a checkpoint; the answer is the full prefill's."""
    with running(hybrid, tmp_path) as worker:
        answer, n1, _ = complete(worker, turn1())
        complete(worker, "Completely unrelated: " + " ".join(f"word{i}" for i in range(80)))
        text2, _, cached2 = complete(worker, turn2(answer))
        assert n1 - TAIL - 2 <= cached2 <= n1 - TAIL
        health = worker.health()
        assert health["prompt_cache"]["restored_total"] == 1 and health["checkpoints"]["restored_total"] == 1
    assert text2 == complete(cold, turn2(answer))[0]


def test_a_dense_model_takes_no_checkpoints(smollm2_path: Path, tmp_path: Path) -> None:
    """SmolLM2 (dense): its KV is cut at the shared prefix itself, nothing is ever checkpointed."""
    with running(smollm2_path, tmp_path) as worker:
        answer, n1, _ = complete(worker, turn1())
        _, _, cached = complete(worker, turn2(answer))
        assert n1 - 2 <= cached <= n1 + ANSWER_TOKENS  # the shared prefix itself, not a checkpoint's TAIL back
        points = worker.health()["checkpoints"]
        assert (points["limit"], points["entries"], points["saved_total"], points["restored_total"]) == (0, 0, 0, 0)
