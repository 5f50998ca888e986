"""The replica router (`gateway.serving.replica_router`), pure: load, sessions, prefixes, overload, health."""

from __future__ import annotations

import pytest

from gateway.serving.replica_router import NoReplica, PrefixIndex, ReplicaLoad, ReplicaRouter, prompt_blocks

TOOLS = "You are a coding agent. " * 200  # ~4.8k characters: an agent's fixed prefix (9 blocks)


def loads(*outstanding: int, down: tuple[str, ...] = ()) -> list[ReplicaLoad]:
    return [ReplicaLoad(f"r{i}", n, healthy=f"r{i}" not in down) for i, n in enumerate(outstanding)]


def test_without_affinity_the_least_loaded_replica_is_picked() -> None:
    router = ReplicaRouter()
    assert router.pick(loads(3, 1, 2), "hi").replica == "r1"
    assert router.pick(loads(0, 0, 0), "hello").replica == "r0"  # ties: the first


def test_a_session_goes_back_to_its_replica_while_that_one_is_not_overloaded() -> None:
    router = ReplicaRouter(balance_abs=4, balance_rel=1.5)
    first = router.pick(loads(1, 0), "turn 1", session="s")
    assert (first.replica, first.reason) == ("r1", "load")
    again = router.pick(loads(0, 3), "turn 2", session="s")
    assert (again.replica, again.reason) == ("r1", "session")  # 3 above the least: within balance_abs
    busy = router.pick(loads(0, 9), "turn 3", session="s")
    assert (busy.replica, busy.reason) == ("r0", "load")  # 9 > 0 + 4 and > 1.5 x 0: overloaded
    assert router.pick(loads(3, 0), "turn 4", session="s").replica == "r0"  # the session moved with it


def test_a_long_shared_prefix_goes_to_the_replica_that_was_sent_it() -> None:
    router = ReplicaRouter()
    assert router.pick(loads(0, 0), TOOLS + "first task").replica == "r0"
    other = router.pick(loads(1, 0), "an unrelated short question")
    assert (other.replica, other.reason) == ("r1", "load")
    same = router.pick(loads(1, 1), TOOLS + "another task, another user")
    assert (same.replica, same.reason) == ("r0", "prefix") and same.prefix_blocks == len(TOOLS) // 512


def test_a_short_shared_prefix_does_not_outweigh_load() -> None:
    router = ReplicaRouter(min_prefix_blocks=2)
    router.pick(loads(0, 0), "x" * 600 + "a")  # one whole block
    pick = router.pick(loads(1, 0), "x" * 600 + "b")
    assert (pick.replica, pick.reason) == ("r1", "load")


def test_a_replica_that_does_not_take_requests_is_never_picked_and_none_left_raises() -> None:
    router = ReplicaRouter()
    router.pick(loads(0, 0), TOOLS, session="s")
    pick = router.pick(loads(0, 5, down=("r0",)), TOOLS, session="s")
    assert pick.replica == "r1"
    with pytest.raises(NoReplica):
        router.pick(loads(0, 0, down=("r0", "r1")), "hi")


def test_forgetting_a_replica_drops_its_prefixes_and_sessions() -> None:
    router = ReplicaRouter()
    router.pick(loads(0, 0), TOOLS, session="s")
    router.forget("r0")
    pick = router.pick(loads(1, 0), TOOLS, session="s")
    assert (pick.replica, pick.reason) == ("r1", "load")


def test_prefix_blocks_are_chained_and_only_whole_blocks_count() -> None:
    a, b = prompt_blocks("x" * 1024 + "y" * 100, 512), prompt_blocks("z" + "x" * 1023, 512)
    assert len(a) == 2 and len(b) == 2 and a[0] != b[0] and a[1] != b[1]  # one change early changes every block
    assert prompt_blocks("x" * 511, 512) == []


def test_the_index_is_bounded_and_evicts_a_prompts_deepest_blocks_first() -> None:
    index = PrefixIndex(capacity_blocks=4)
    long = prompt_blocks("a" * 512 * 6, 512)
    index.add("r0", long)
    assert index.match("r0", long) == 4  # the first four kept, the two deepest evicted
    other = prompt_blocks("b" * 512 * 2, 512)
    index.add("r0", other)
    assert index.match("r0", other) == 2 and index.match("r0", long) == 2


def test_sessions_are_bounded() -> None:
    router = ReplicaRouter(sessions_kept=2)
    for session in ("a", "b", "c"):
        router.pick(loads(0, 0), "q", session=session)
    assert router.pick(loads(0, 0), "q", session="a").reason == "load"  # "a" was the oldest: forgotten
