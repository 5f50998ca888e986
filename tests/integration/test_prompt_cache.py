"""Hot prefixes saved to host memory when their slot is reused (issue 22), on a stand-in for llama.cpp's
sequence-state calls: what is saved, what is restored (only the shared prefix's tokens), the byte bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from backends.base import DeploymentPlan, EngineName, LlamaCppOptions
from backends.llamacpp.adapter import LlamaCppAdapter
from backends.llamacpp.worker.cli import build_parser
from backends.llamacpp.worker.prompt_cache import MIN_SAVE_TOKENS, HostPrompts, PromptCache
from backends.llamacpp.worker.slots import Origin, Slot, common_prefix_len

TOOLS = list(range(1000, 3000))  # a long tools prefix
TITLE = list(range(50, 400))  # a background task sharing nothing with it
IMAGE_A, IMAGE_B = -11, -12  # image placeholders (vision.cache_tokens): one per image digest


class FakeModel:
    """Sequence states as the token lists they hold, 1 byte per token; `fail_restore` refuses loads."""

    def __init__(self) -> None:
        self.seqs: dict[int, list[int]] = {}
        self.fail_restore = False

    def seq_clear(self, seq_id: int) -> None:
        self.seqs[seq_id] = []

    def seq_state_size(self, seq_id: int) -> int:
        return len(self.seqs.get(seq_id, []))

    def seq_state_save(self, seq_id: int, size: int) -> bytearray | None:
        return bytearray(t % 256 for t in self.seqs[seq_id][:size])

    def seq_state_restore(self, seq_id: int, state: bytearray) -> bool:
        if self.fail_restore:
            return False
        self.seqs[seq_id] = list(state)
        return True


def host(limit: int) -> tuple[HostPrompts, FakeModel]:
    model = FakeModel()
    return HostPrompts(cast(Any, model), PromptCache(limit)), model


def slot_holding(model: FakeModel, tokens: list[int]) -> Slot:
    """Slot 0 holding `tokens`, left by a request whose prompt was all of them (on the CPU's policy: worth
    keeping; `tests/unit/test_prompt_cache_policy.py` tests the policy itself)."""
    model.seqs[0] = list(tokens)
    return Slot(0, cached=list(tokens), origin=Origin(len(tokens), 0))


def test_an_overwritten_slot_is_saved_and_restored_for_the_prompt_that_shares_it() -> None:
    prompts, model = host(10_000)
    slot = slot_holding(model, TOOLS)
    prompts.prepare(slot, TITLE)  # the title task takes the only slot: the tools prefix is saved
    assert prompts.cache.stats().entries == 1 and slot.cached == TOOLS  # the scheduler cuts it next
    slot.cached[:] = TITLE
    model.seqs[0] = list(TITLE)
    prompts.prepare(slot, [*TOOLS, 7, 8, 9])  # the next message: the saved state is loaded back
    assert slot.cached == TOOLS
    assert prompts.cache.stats().restored_total == 1


def test_a_slot_the_prompt_keeps_is_not_saved() -> None:
    prompts, model = host(10_000)
    slot = slot_holding(model, TOOLS)
    prompts.prepare(slot, [*TOOLS[: len(TOOLS) - MIN_SAVE_TOKENS + 1], 5])
    assert prompts.cache.stats().entries == 0


def test_a_state_is_restored_only_when_it_shares_more_than_the_slot() -> None:
    prompts, model = host(10_000)
    prompts.cache.put(TOOLS[:100], bytearray(100))
    slot = slot_holding(model, TOOLS[:500])
    prompts.prepare(slot, [*TOOLS[:400], 1])
    assert slot.cached == TOOLS[:500] and prompts.cache.stats().restored_total == 0


def test_a_different_image_is_never_restored() -> None:
    prompts, model = host(10_000)
    with_a = [*range(100, 200), IMAGE_A, *range(200, 300)]
    prompts.cache.put(with_a, bytearray(len(with_a)))
    slot = slot_holding(model, [])
    prompts.prepare(slot, [*range(100, 200), IMAGE_B, *range(200, 300)])
    assert slot.cached == with_a  # loaded whole: the scheduler then cuts it where the images differ
    assert common_prefix_len(slot.cached, [*range(100, 200), IMAGE_B]) == 100
    assert prompts.cache.best([IMAGE_B, *range(200, 300)]) is None


def test_the_bound_evicts_the_oldest_and_covered_states() -> None:
    cache = PromptCache(2500)
    assert cache.put(TOOLS[:1000], bytearray(1000))
    assert cache.put(TITLE, bytearray(1000))
    assert cache.put(TOOLS[:1200], bytearray(1200))  # covers the first: it goes, not the title
    assert cache.stats().entries == 2 and cache.stats().bytes == 2200
    assert cache.put(list(range(5000, 5800)), bytearray(800))  # over the bound: the oldest (title) goes
    assert cache.best(TITLE) is None and cache.stats().bytes == 2000
    assert not cache.put(list(range(6000, 9000)), bytearray(3000))  # larger than the whole bound


def test_the_number_of_states_is_bounded_too() -> None:
    cache = PromptCache(10_000, max_entries=2)
    for start in (100, 200, 300):
        assert cache.put(list(range(start, start + 50)), bytearray(50))
    assert cache.stats().entries == 2 and cache.best(list(range(100, 150))) is None


def test_zero_turns_it_off() -> None:
    prompts, model = host(0)
    slot = slot_holding(model, TOOLS)
    prompts.prepare(slot, TITLE)
    assert prompts.cache.stats().entries == 0 and not prompts.cache.put(TOOLS, bytearray(10))


def test_a_refused_restore_leaves_an_empty_slot_and_drops_the_state() -> None:
    prompts, model = host(10_000)
    prompts.cache.put(TOOLS, bytearray(len(TOOLS)))
    model.fail_restore = True
    slot = slot_holding(model, TITLE[:10])
    prompts.prepare(slot, [*TOOLS, 1])
    assert slot.cached == [] and model.seqs[0] == [] and prompts.cache.stats().entries == 0


def test_the_config_option_reaches_the_workers_command_line() -> None:
    def plan(options: LlamaCppOptions) -> DeploymentPlan:
        return DeploymentPlan(
            model="m", engine=EngineName.LLAMACPP, source_path=Path("/m.gguf"), model_format="gguf",
            context_tokens=512, llamacpp=options,
        )  # fmt: skip

    assert "--prompt-cache-mib" not in LlamaCppAdapter().launch_spec(plan(LlamaCppOptions()), 8123).argv
    argv = list(LlamaCppAdapter().launch_spec(plan(LlamaCppOptions(prompt_cache_mib=0)), 8123).argv)
    assert argv[argv.index("--prompt-cache-mib") + 1] == "0"
    assert (
        build_parser()
        .parse_args(["--model", "m.gguf", "--model-name", "m", "--port", "1", "--ctx", "512", "--slots", "1"])
        .prompt_cache_mib
        == 2048
    )
