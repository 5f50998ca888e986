"""`fill_gaps` (on by default with GPU offload, where a contiguous batch of sequences is faster): an idle slot
between two busy ones gets a throwaway token, removed after the decode. It must never change an answer.

Exercised on the CPU (the option is the same code on every backend): the real worker on the real SmolLM2
GGUF with `--fill-gaps on`, concurrent requests of different lengths (so slots fall idle between busy
ones) must give exactly what each request gives alone on a worker without it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest

from backends.llamacpp.worker.slots import Run, Slot, fillers
from tests.integration.test_llamacpp_worker import CASES, CTX, MAX_QUEUE, SLOTS, run_case
from tests.worker_process import start_worker, stop

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_filler_goes_to_each_idle_slot_between_two_busy_ones() -> None:
    slots = [Slot(i) for i in range(5)]
    runs = [Run(slots[0], None, (1,), True), Run(slots[3], None, (2,), True)]
    found = fillers(slots, runs, room=8, n_ctx=64, token=7)
    assert [r.slot.seq_id for r in found] == [1, 2]
    assert all(r.tokens == (7,) and not r.logits and r.seq is None for r in found)
    assert len(fillers(slots, runs, room=1, n_ctx=64, token=7)) == 1  # bounded by the batch's room
    slots[1].cached = [0] * 64
    assert [r.slot.seq_id for r in fillers(slots, runs, room=8, n_ctx=64, token=7)] == [2]  # a full slot is skipped


def _up(url: str, process: object) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError("worker not healthy within 60 s")


async def test_answers_with_fill_gaps_match_the_solo_answers(smollm2_path: Path, tmp_path: Path) -> None:
    args = ["--ctx", str(CTX), "--slots", str(SLOTS), "--max-queue", str(MAX_QUEUE), "--n-threads", "1"]
    plain, plain_url = start_worker(smollm2_path, tmp_path / "plain.log", *args)
    filled, filled_url = start_worker(smollm2_path, tmp_path / "filled.log", *args, "--fill-gaps", "on")
    try:
        _up(plain_url, plain)
        _up(filled_url, filled)
        async with httpx.AsyncClient(base_url=plain_url, timeout=120) as client:
            solo = [await run_case(client, case) for case in CASES]
        async with httpx.AsyncClient(base_url=filled_url, timeout=120) as client:
            together = await asyncio.gather(*(run_case(client, case) for case in CASES))
        assert list(together) == solo
    finally:
        stop(plain)
        stop(filled)
