"""The SQLite response store: chains into histories, persistence across reopen, retention and size limits."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from gateway.ops.store import FILENAME, NotFound, ResponseStore


class FakeClock:
    """Stands for `time.time`: advanced by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def response(response_id: str, previous: str | None, text: str) -> dict[str, Any]:
    item = {"id": f"msg_{response_id}", "type": "message", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}  # fmt: skip
    return {"id": response_id, "object": "response", "previous_response_id": previous, "output": [item]}


async def chain(store: ResponseStore, length: int, clock: FakeClock | None = None) -> None:
    previous = None
    for i in range(1, length + 1):
        await store.put(response(f"resp_{i}", previous, f"answer {i}"), [user(f"question {i}")])
        previous = f"resp_{i}"
        if clock is not None:
            clock.now += 1


def texts(items: list[dict[str, Any]]) -> list[str]:
    return [i["content"] if isinstance(i["content"], str) else i["content"][0]["text"] for i in items]


async def test_history_is_every_turns_input_then_output_oldest_first(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    await chain(store, 3)
    assert texts(await store.history("resp_3")) == [
        "question 1", "answer 1", "question 2", "answer 2", "question 3", "answer 3",
    ]  # fmt: skip
    assert texts(await store.history("resp_1")) == ["question 1", "answer 1"]
    assert (await store.get("resp_2"))["previous_response_id"] == "resp_1"
    assert await store.input_items("resp_2") == [user("question 2")]
    store.close()


async def test_unknown_ids_are_not_found(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    for call in (store.get, store.history, store.delete, store.input_items):
        with pytest.raises(NotFound) as caught:
            await call("resp_nope")
        assert caught.value.response_id == "resp_nope" and "resp_nope" in str(caught.value)
    store.close()


async def test_a_deleted_ancestor_breaks_the_chain_naming_it(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    await chain(store, 3)
    await store.delete("resp_2")
    with pytest.raises(NotFound) as caught:
        await store.history("resp_3")
    assert caught.value.response_id == "resp_2"
    with pytest.raises(NotFound):
        await store.get("resp_2")
    store.close()


async def test_responses_survive_reopening_the_data_directory(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "data")
    await chain(store, 2)
    store.close()
    assert (tmp_path / "data" / FILENAME).is_file()
    reopened = ResponseStore(tmp_path / "data")
    assert texts(await reopened.history("resp_2")) == ["question 1", "answer 1", "question 2", "answer 2"]
    assert (await reopened.get("resp_1"))["output"][0]["content"][0]["text"] == "answer 1"
    reopened.close()


async def test_storing_the_same_id_again_replaces_it(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    await store.put(response("resp_1", None, "first"), [user("q")])
    await store.put(response("resp_1", None, "second"), [user("q")])
    assert texts(await store.history("resp_1")) == ["q", "second"]
    store.close()


async def test_unused_responses_age_out_but_a_continued_chain_is_kept(tmp_path: Path) -> None:
    clock = FakeClock()
    store = ResponseStore(tmp_path, max_age_s=100, clock=clock)
    await store.put(response("old", None, "abandoned"), [user("q")])
    await store.put(response("root", None, "a"), [user("q")])
    clock.now += 90
    await store.put(response("child", "root", "b"), [user("q")])  # uses root: its age restarts
    clock.now += 20
    assert await store.prune() == 1
    with pytest.raises(NotFound):
        await store.get("old")
    assert texts(await store.history("child")) == ["q", "a", "q", "b"]
    clock.now += 101
    assert await store.prune() == 2
    store.close()


async def test_row_limit_drops_the_least_recently_used(tmp_path: Path) -> None:
    clock = FakeClock()
    store = ResponseStore(tmp_path, max_age_s=None, max_rows=3, clock=clock)
    await store.put(response("a", None, "x"), [user("q")])
    clock.now += 1
    await store.put(response("b", None, "x"), [user("q")])
    clock.now += 1
    await store.put(response("a2", "a", "x"), [user("q")])  # refreshes a
    clock.now += 1
    await store.put(response("c", None, "x"), [user("q")])
    with pytest.raises(NotFound):
        await store.get("b")
    for kept in ("a", "a2", "c"):
        await store.get(kept)
    store.close()


async def test_byte_limit_keeps_the_most_recent_that_fit(tmp_path: Path) -> None:
    clock = FakeClock()
    store = ResponseStore(tmp_path, max_age_s=None, max_bytes=7_000, clock=clock)
    big = "x" * 3_000
    for name in ("a", "b", "c", "d"):
        await store.put(response(name, None, big), [user("q")])
        clock.now += 1
    kept = []
    for name in ("a", "b", "c", "d"):
        try:
            await store.get(name)
            kept.append(name)
        except NotFound:
            pass
    assert kept == ["c", "d"]
    store.close()


async def test_concurrent_puts_and_reads_from_the_event_loop(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    await asyncio.gather(*(store.put(response(f"r{i}", None, str(i)), [user(str(i))]) for i in range(50)))
    histories = await asyncio.gather(*(store.history(f"r{i}") for i in range(50)))
    assert [texts(h) for h in histories] == [[str(i), str(i)] for i in range(50)]
    store.close()


async def test_input_items_with_history_are_what_the_model_saw(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    await chain(store, 3)
    assert texts(await store.input_items("resp_3", with_history=True)) == [
        "question 1", "answer 1", "question 2", "answer 2", "question 3",
    ]  # fmt: skip
    await store.delete("resp_1")  # what is no longer stored is left out, the rest still listed
    assert texts(await store.input_items("resp_3", with_history=True)) == ["question 2", "answer 2", "question 3"]
    store.close()


async def test_an_owner_never_sees_another_owners_responses(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path)
    await store.put(response("resp_a", None, "alice's"), [user("q")], owner="alice")
    for call in (store.get, store.history, store.input_items, store.delete):
        with pytest.raises(NotFound):
            await call("resp_a", "bob")
        with pytest.raises(NotFound):
            await call("resp_a")  # no owner is an owner too
    assert texts(await store.history("resp_a", "alice")) == ["q", "alice's"]
    await store.delete("resp_a", "alice")
    store.close()


async def test_the_database_is_opened_on_first_use(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "data")
    assert not (tmp_path / "data").exists()
    with pytest.raises(NotFound):
        await store.get("resp_1")
    assert (tmp_path / "data" / FILENAME).is_file()
    store.close()
    store.close()


async def test_a_version_1_database_gains_the_owner_column(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / FILENAME)
    db.executescript(
        "CREATE TABLE responses (id TEXT PRIMARY KEY, previous_id TEXT, created_at REAL NOT NULL, used_at REAL NOT "
        "NULL, input TEXT NOT NULL, response TEXT NOT NULL, size_bytes INTEGER NOT NULL); PRAGMA user_version = 1;"
    )
    db.execute("INSERT INTO responses VALUES ('resp_old', NULL, 1e12, 1e12, '[]', '{\"id\": \"resp_old\"}', 2)")
    db.commit()
    db.close()
    store = ResponseStore(tmp_path, max_age_s=None)
    assert (await store.get("resp_old"))["id"] == "resp_old"
    await store.put(response("resp_new", None, "x"), [user("q")], owner="k")
    assert (await store.get("resp_new", "k"))["id"] == "resp_new"
    store.close()
    with contextlib.closing(sqlite3.connect(tmp_path / FILENAME)) as check:
        assert check.execute("PRAGMA user_version").fetchone()[0] == 2
