"""Stored Responses (`store: true`): SQLite in the data directory, so `previous_response_id` survives restarts.

Each row keeps one response's request input items and the Response JSON (its output items are the
Response's `output`; `size_bytes` counts both), and its `owner` (the API key's id): every lookup is scoped
to one owner, so a key never reads, continues or deletes another key's responses. A follow-up
turn resolves its `previous_response_id` chain into one flat item history (oldest turn first: its inputs,
then its outputs), which the Responses translation replays as chat messages.

Retention counts from a chain's last use: storing a response refreshes `used_at` on every ancestor, so
a conversation that is still continued is not pruned from under itself, while abandoned ones age out
(`max_age_s`) or are dropped least recently used first once `max_rows` or `max_bytes` is exceeded.
Deleting or pruning an ancestor makes its descendants' histories unresolvable (`NotFound`).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id          TEXT PRIMARY KEY,
    previous_id TEXT,
    created_at  REAL NOT NULL,
    used_at     REAL NOT NULL,
    input       TEXT NOT NULL,
    response    TEXT NOT NULL,
    size_bytes  INTEGER NOT NULL,
    owner       TEXT
);
CREATE INDEX IF NOT EXISTS responses_used_at ON responses (used_at);
"""
SCHEMA_VERSION = 2
_MIGRATIONS = {1: "ALTER TABLE responses ADD COLUMN owner TEXT"}  # from user_version 1 (no owner column)

# The chain from one of an owner's responses back to the first, nearest first; depth bounds a corrupt cycle.
# (Every ancestor has the same owner: a key can only continue responses it can read.)
_CHAIN = """
WITH RECURSIVE chain(id, previous_id, depth) AS (
    SELECT id, previous_id, 0 FROM responses WHERE id = ? AND owner IS ?
    UNION ALL
    SELECT r.id, r.previous_id, chain.depth + 1
    FROM responses r JOIN chain ON r.id = chain.previous_id
    WHERE chain.depth < ?
)
"""

MAX_CHAIN = 10_000
"""Turns followed back from one response; a longer chain is treated as broken."""

FILENAME = "responses.sqlite3"


class NotFound(KeyError):
    """No stored response with that id (never stored, `store: false`, deleted, or pruned)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(response_id)
        self.response_id = response_id

    def __str__(self) -> str:
        return f"no stored response with id {self.response_id!r}"


class ResponseStore:
    """SQLite-backed store of Responses, for use from asyncio.

    Concurrency: one connection (`check_same_thread=False`) guarded by a `threading.Lock`; every public
    coroutine runs its statements in a worker thread (`asyncio.to_thread`), so the event loop never
    blocks on disk. The database is opened on first use (a gateway that never stores touches no disk), and
    writes commit before the coroutine returns. `close()` waits for the statement in progress; a call after
    it opens the database again.

    `owner` scopes every call: a response is only found by the owner that stored it (`None` is an owner
    too: the rows stored without one).
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        max_age_s: float | None = 30 * 24 * 3600,
        max_rows: int | None = None,
        max_bytes: int | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.path = Path(data_dir) / FILENAME
        self.max_age_s = max_age_s
        self.max_rows = max_rows
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None

    # -- public coroutines ------------------------------------------------------------------------------
    async def put(self, response: dict[str, Any], input_items: list[dict[str, Any]], owner: str | None = None) -> None:
        """Store `response` (its `output` and `previous_response_id` are read from it) with its input items,
        refresh its chain's last use, then prune."""
        await asyncio.to_thread(self._put, response, input_items, owner)

    async def get(self, response_id: str, owner: str | None = None) -> dict[str, Any]:
        """The stored Response JSON; raises `NotFound`."""
        return await asyncio.to_thread(self._get, response_id, owner)

    async def input_items(
        self, response_id: str, owner: str | None = None, *, with_history: bool = False
    ) -> list[dict[str, Any]]:
        """The request input items of one stored response; raises `NotFound`. `with_history`: preceded by
        every item of the earlier turns of its chain (inputs, then outputs, oldest first) still stored."""
        return await asyncio.to_thread(self._input_items, response_id, owner, with_history)

    async def history(self, response_id: str, owner: str | None = None) -> list[dict[str, Any]]:
        """Every item of the chain ending at `response_id`, oldest turn first: each turn's input items, then
        its output items. Raises `NotFound` naming the first missing response of the chain."""
        return await asyncio.to_thread(self._history, response_id, owner)

    async def delete(self, response_id: str, owner: str | None = None) -> None:
        """Remove one response; raises `NotFound`."""
        await asyncio.to_thread(self._delete, response_id, owner)

    async def prune(self) -> int:
        """Apply retention and the size limits now; the number of responses removed."""
        return await asyncio.to_thread(self._prune)

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # -- statements (worker thread, under the lock) -----------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        """The connection, opened (and the schema created or migrated) on first use; the caller holds the lock."""
        if self._db is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version in _MIGRATIONS:
                db.execute(_MIGRATIONS[version])
            db.executescript(_SCHEMA)
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db = db
        return self._db

    def _put(self, response: dict[str, Any], input_items: list[dict[str, Any]], owner: str | None) -> None:
        now = self._clock()
        input_json, response_json = json.dumps(input_items), json.dumps(response)
        size = len(input_json.encode()) + len(response_json.encode())
        row = (response["id"], response.get("previous_response_id"), now, now, input_json, response_json, size, owner)
        with self._lock, self._conn() as db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT OR REPLACE INTO responses (id, previous_id, created_at, used_at, input, response, size_bytes, "
                "owner) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )
            db.execute(
                _CHAIN + "UPDATE responses SET used_at = ? WHERE id IN (SELECT id FROM chain)",
                (response["id"], owner, MAX_CHAIN, now),
            )
            self._prune_locked(db, now)

    def _column(self, column: str, response_id: str, owner: str | None) -> Any:
        with self._lock:
            query = f"SELECT {column} FROM responses WHERE id = ? AND owner IS ?"
            row = self._conn().execute(query, (response_id, owner)).fetchone()
        if row is None:
            raise NotFound(response_id)
        return json.loads(row[0])

    def _get(self, response_id: str, owner: str | None) -> dict[str, Any]:
        result: dict[str, Any] = self._column("response", response_id, owner)
        return result

    def _input_items(self, response_id: str, owner: str | None, with_history: bool) -> list[dict[str, Any]]:
        if not with_history:
            items: list[dict[str, Any]] = self._column("input", response_id, owner)
            return items
        rows = self._chain_rows(response_id, owner)
        if not rows:
            raise NotFound(response_id)
        items = []
        for i, (_previous, input_json, response_json) in enumerate(rows):
            items += json.loads(input_json)
            if i < len(rows) - 1:
                items += json.loads(response_json).get("output") or []
        return items

    def _chain_rows(self, response_id: str, owner: str | None) -> list[tuple[str | None, str, str]]:
        query = (
            _CHAIN + "SELECT chain.previous_id, r.input, r.response FROM chain "
            "JOIN responses r ON r.id = chain.id ORDER BY chain.depth DESC"
        )
        with self._lock:
            rows: list[tuple[str | None, str, str]] = (
                self._conn().execute(query, (response_id, owner, MAX_CHAIN)).fetchall()
            )
        return rows

    def _history(self, response_id: str, owner: str | None) -> list[dict[str, Any]]:
        rows = self._chain_rows(response_id, owner)
        if not rows:
            raise NotFound(response_id)
        if rows[0][0] is not None:  # the oldest turn found still names a predecessor: the chain is broken
            raise NotFound(rows[0][0])
        items: list[dict[str, Any]] = []
        for _previous, input_json, response_json in rows:
            items += json.loads(input_json)
            items += json.loads(response_json).get("output") or []
        return items

    def _delete(self, response_id: str, owner: str | None) -> None:
        with self._lock, self._conn() as db:
            deleted = db.execute("DELETE FROM responses WHERE id = ? AND owner IS ?", (response_id, owner)).rowcount
        if not deleted:
            raise NotFound(response_id)

    def _prune(self) -> int:
        with self._lock, self._conn() as db:
            db.execute("BEGIN IMMEDIATE")
            return self._prune_locked(db, self._clock())

    def _prune_locked(self, db: sqlite3.Connection, now: float) -> int:
        removed = 0
        if self.max_age_s is not None:
            removed += db.execute("DELETE FROM responses WHERE used_at < ?", (now - self.max_age_s,)).rowcount
        if self.max_rows is not None:
            removed += db.execute(
                "DELETE FROM responses WHERE id IN "
                "(SELECT id FROM responses ORDER BY used_at DESC, created_at DESC LIMIT -1 OFFSET ?)",
                (self.max_rows,),
            ).rowcount
        if self.max_bytes is not None:
            # Keep the most recently used rows whose running size fits; drop the rest.
            removed += db.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM (SELECT id, SUM(size_bytes) OVER "
                "(ORDER BY used_at DESC, created_at DESC ROWS UNBOUNDED PRECEDING) AS total FROM responses) "
                "WHERE total > ?)",
                (self.max_bytes,),
            ).rowcount
        return removed
