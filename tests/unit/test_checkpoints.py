"""Context checkpoints' pure logic (`backends.llamacpp.worker.checkpoints`): where a prompt is checkpointed,
which checkpoint a cut restores, the per-slot bound, and the scheduler's hooks on a fake model."""

from __future__ import annotations

from typing import Any, cast

from backends.llamacpp.worker.checkpoints import (
    TAIL,
    Checkpoint,
    Checkpointer,
    CheckpointStore,
    added,
    choose,
    chunk_end,
    cut,
    reachable,
    targets,
    uncut,
)
from backends.llamacpp.worker.slots import MIN_REUSE_TOKENS
from tests.unit.llamacpp_argv import flag_value, llamacpp_argv


def point(pos: int, size: int = 10) -> Checkpoint:
    return Checkpoint(pos, bytearray(size))


def test_a_prompt_is_checkpointed_a_few_tokens_and_a_batch_before_its_end() -> None:
    assert targets(1000, 512) == (1000 - TAIL - 512, 1000 - TAIL)
    assert targets(300, 512) == (300 - TAIL,)  # a batch before the end would be before the start
    assert targets(MIN_REUSE_TOKENS + TAIL - 1, 512) == ()  # too short to be worth a copy
    # a prefill chunk ends at each target inside it, so the state there exists after that decode
    assert chunk_end(1000, 512, 0, 512) == 484
    assert chunk_end(1000, 512, 484, 996) == 996
    assert chunk_end(1000, 512, 996, 1000) == 1000
    assert chunk_end(1000, 512, 990, 1000) == 996


def test_the_newest_checkpoint_at_or_before_the_cut_is_chosen() -> None:
    points = [point(100), point(480), point(496)]
    assert choose(points, 999) == points[2]
    assert choose(points, 496) == points[2]
    assert choose(points, 495) == points[1]
    assert choose(points, 99) is None
    assert choose([point(0)], 10) is None  # nothing kept: a cut to 0 never needs one
    assert reachable(500, points, 600) == 600  # nothing to cut: all of it is kept
    assert reachable(500, points, 490) == 480
    assert reachable(500, points, 50) == 0


def test_the_list_is_bounded_newest_kept_and_cut_with_the_slot() -> None:
    points: list[Checkpoint] = []
    for pos in (10, 20, 30, 40):
        points = added(points, point(pos), 3)
    assert [p.pos for p in points] == [20, 30, 40]
    again = point(30, 5)
    assert added(points, again, 3) == [points[0], again, points[2]]  # the same position replaced
    assert added(points, point(50), 0) == []
    assert [p.pos for p in cut(points, 35)] == [20, 30]


def test_the_store_counts_shared_states_once() -> None:
    store = CheckpointStore(2, recurrent=True)
    store.put(0, point(16, 100))
    store.put(0, point(32, 100))
    store.replace(1, store.of(0))  # a group follower holds its leader's tokens
    stats = store.stats()
    assert (stats.entries, stats.bytes) == (4, 200)
    store.cut(0, 20)
    store.clear(1)
    assert (store.stats().entries, store.stats().bytes) == (1, 100)
    assert CheckpointStore(0).stats().limit == 0


class FakeModel:
    """Records the native calls; `refuse_cut` makes `seq_remove` fail like a recurrent state's."""

    def __init__(self, *, restore_ok: bool = True, refuse_cut: bool = False) -> None:
        self.calls: list[tuple[str, int, int]] = []
        self.restore_ok = restore_ok
        self.refuse_cut = refuse_cut

    def seq_partial_restore(self, seq_id: int, state: bytearray) -> bool:
        self.calls.append(("restore", seq_id, len(state)))
        return self.restore_ok

    def seq_remove(self, seq_id: int, start: int) -> bool:
        self.calls.append(("remove", seq_id, start))
        return not self.refuse_cut

    def seq_clear(self, seq_id: int) -> None:
        self.calls.append(("clear", seq_id, -1))


def checkpointer(model: FakeModel) -> Checkpointer:
    store = CheckpointStore(8, recurrent=True)
    store.put(3, point(100, 7))
    store.put(3, point(200, 9))
    return Checkpointer(cast(Any, model), store, 512)


def test_a_failed_cut_restores_the_checkpoint_then_cuts_after_it() -> None:
    model = FakeModel()
    ckpt = checkpointer(model)
    assert uncut(cast(Any, model), ckpt, 3, 150) == 100
    assert model.calls == [("restore", 3, 7), ("remove", 3, 100)]
    assert (ckpt.store.restored, ckpt.store.restored_tokens) == (1, 100)


def test_without_a_usable_checkpoint_the_sequence_is_cleared() -> None:
    for model, keep in ((FakeModel(), 50), (FakeModel(restore_ok=False), 150), (FakeModel(refuse_cut=True), 150)):
        assert uncut(cast(Any, model), checkpointer(model), 3, keep) == 0
        assert model.calls[-1] == ("clear", 3, -1)
    dense = FakeModel()  # no checkpointer (a dense model, or checkpoints off): the old path, a clear
    assert uncut(cast(Any, dense), None, 3, 150) == 0
    assert dense.calls == [("clear", 3, -1)]


def test_prompts_shorter_than_the_copy_threshold_get_no_checkpoints() -> None:
    ckpt = Checkpointer(cast(Any, FakeModel()), CheckpointStore(4, recurrent=True), 512, min_prompt=1024)
    assert ckpt.chunk_end(1000, 0, 512) == 512  # below the threshold: the chunk is not cut
    assert ckpt.chunk_end(2000, 1400, 1912) == 1484  # 2000 - TAIL - 512


def test_the_config_option_reaches_the_worker_only_when_set() -> None:
    assert "--ctx-checkpoints" not in llamacpp_argv()  # the worker's default
    assert flag_value(llamacpp_argv(ctx_checkpoints=0), "--ctx-checkpoints") == "0"
