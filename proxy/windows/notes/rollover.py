"""Pending rollovers: what `new_context` and a manual checkpoint leave for the session's next sampling.

One row per agent of a task (`(task_id, address)`: the journal has one session per agent, and a session
without x-ctp-task has a task of its own), in the shared state database (SQLite, WAL). Marking is
idempotent: calling `new_context` twice, or marking a checkpoint twice, leaves one pending rollover.
A manual checkpoint is the stronger request (it asks the proxy to run the checkpoint turn first), so a
`checkpoint` mark is never weakened back to `new_context`. `take_pending` consumes the row atomically
(`DELETE … RETURNING` in one statement): two proxy processes forwarding the session's next request
cannot both apply it.

The functions take a connection; the proxy calls them through its one database thread
(`proxy/dbworker.py`, `RolloverStore`), the tool server and the CLI with a connection of their own.

Every request of a known session asks whether its agent has a rollover pending. Read from SQLite that costs
≈0.1 ms inside the proxy: the journal, usage and compaction commit between any two requests, so the reader's
page cache is gone each time, and the query hands the GIL to the proxy's writer threads while SQLite runs.
A mark therefore also writes the time into a stamp file beside the database (`bump_stamp`, in `mark_pending`,
after its statement has committed), and the proxy trusts its last "nothing pending" for an agent while the stamp
is the one it read before that query. The proxy has the stamp mapped (`StampView`): reading it is a memory read,
no system call. A mark made inside a caller's longer transaction stamps before its commit; such an answer is
trusted for `EMPTY_TRUSTED_FOR` seconds at most.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import sqlite3
import time
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.db import register_schema
from proxy.dbworker import DBWorker
from proxy.windows.notes.pending import KINDS, Kind, Pending

if TYPE_CHECKING:
    from proxy.windows.notes.port import RolloverBackend


SCHEMA = """
CREATE TABLE IF NOT EXISTS context_rollovers (
    task_id TEXT NOT NULL,
    address TEXT NOT NULL,
    kind TEXT NOT NULL,                -- new_context | checkpoint
    origin TEXT NOT NULL,              -- who asked: tool | cli | rest (a category, never content)
    window_id TEXT,                    -- the window it was asked in, when known
    requested_at REAL NOT NULL,
    PRIMARY KEY (task_id, address)
) WITHOUT ROWID;
"""
register_schema("context_rollovers", SCHEMA)


def ensure(conn: sqlite3.Connection) -> None:
    """The table, on a connection opened before this module registered its schema."""
    conn.executescript(SCHEMA)



def _pending(row: sqlite3.Row | tuple | None) -> Pending | None:
    if row is None:
        return None
    task_id, address, kind, origin, window_id, at = tuple(row)
    return Pending(task_id, address, kind, origin, window_id, at)


def mark_pending(conn: sqlite3.Connection, task_id: str, address: str, kind: Kind = "new_context",
                 origin: str = "tool", window_id: str | None = None, at: float | None = None) -> Pending:
    """Leave a rollover for the agent's next forwarded sampling request; idempotent. Returns the pending
    rollover as it now stands (an earlier mark keeps its time; `checkpoint` wins over `new_context`)."""
    if kind not in KINDS:
        raise ValueError(f"unknown rollover kind {kind!r}")
    row = conn.execute(
        "INSERT INTO context_rollovers(task_id, address, kind, origin, window_id, requested_at)"
        " VALUES (?,?,?,?,?,?) ON CONFLICT(task_id, address) DO UPDATE SET"
        " kind = CASE WHEN excluded.kind = 'checkpoint' THEN 'checkpoint' ELSE context_rollovers.kind END,"
        " origin = CASE WHEN excluded.kind = 'checkpoint' THEN excluded.origin ELSE context_rollovers.origin END"
        " RETURNING task_id, address, kind, origin, window_id, requested_at",
        (task_id, address, kind, origin, window_id, at if at is not None else time.time())).fetchall()
    # (all rows read: the statement is done, and committed unless the caller holds a transaction)
    bump_stamp(conn)
    pending = _pending(row[0] if row else None)
    assert pending is not None
    return pending


STAMP_SUFFIX = "-rollovers.stamp"
EMPTY_TRUSTED_FOR = 2.0  # seconds: at most this long is a "nothing pending" trusted on an unchanged stamp
_STAMP_BYTES = 8


def stamp_path(db_path: str | Path) -> Path:
    return Path(f"{db_path}{STAMP_SUFFIX}")


def bump_stamp(conn: sqlite3.Connection) -> None:
    """Tell every process that reads pending rollovers that a mark may be new: the stamp file's 8 bytes take the
    time (written in place, never replaced: the readers have the file mapped; see the module's docstring)."""
    row = conn.execute("PRAGMA database_list").fetchone()
    path = row[2] if row is not None else ""
    if not path:
        return  # an in-memory database: no other process reads it
    try:
        fd = os.open(stamp_path(path), os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            os.pwrite(fd, time.time_ns().to_bytes(_STAMP_BYTES, "little"), 0)
        finally:
            os.close(fd)
    except OSError:  # a read-only state directory: the readers then find no stamp and always query
        pass


class StampView:
    """The stamp file mapped into this process's memory: reading it is a memory read. A system call on the
    request path (`os.stat`, a query) releases the GIL, and with the writer threads busy, getting it back cost
    ≈0.08 ms a request in process; the mapped page is the kernel's own copy of the file, so a writer's
    `pwrite` in any process shows at once."""

    def __init__(self, db_path: str | Path):
        self.path = stamp_path(db_path)
        self._map: mmap.mmap | None = None
        self._ino: int | None = None

    def _open(self) -> None:
        self.close()
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
        except OSError:
            return  # (read-only: no stamp; every check queries)
        try:
            st = os.fstat(fd)
            if st.st_size < _STAMP_BYTES:
                os.ftruncate(fd, _STAMP_BYTES)  # (only ever longer: a mapped page past the file's end would fault)
            self._map = mmap.mmap(fd, _STAMP_BYTES, access=mmap.ACCESS_READ)
            self._ino = st.st_ino
        except (OSError, ValueError):
            self._map = None
        finally:
            os.close(fd)

    def value(self) -> bytes | None:
        if self._map is None and self._ino is None:
            self._open()
            if self._map is None:
                self._ino = -1  # tried once; `revalidate` tries again
        return self._map[:_STAMP_BYTES] if self._map is not None else None

    def revalidate(self) -> None:
        """Map the file again if it was replaced (deleted and made anew) since it was mapped."""
        try:
            ino = os.stat(self.path).st_ino
        except OSError:
            ino = None
        if ino != self._ino:
            self._open()

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
        self._map, self._ino = None, None


def peek_pending(conn: sqlite3.Connection, task_id: str, address: str) -> Pending | None:
    return _pending(conn.execute(
        "SELECT task_id, address, kind, origin, window_id, requested_at FROM context_rollovers"
        " WHERE task_id=? AND address=?", (task_id, address)).fetchone())


def take_pending(conn: sqlite3.Connection, task_id: str, address: str,
                 kinds: tuple[Kind, ...] = KINDS) -> Pending | None:
    """Consume the agent's pending rollover, if any (of one of `kinds`: a caller that cannot run the
    checkpoint turn leaves a checkpoint mark alone): at most one caller ever gets it."""
    marks = ",".join("?" * len(kinds))
    return _pending(conn.execute(
        f"DELETE FROM context_rollovers WHERE task_id=? AND address=? AND kind IN ({marks})"
        " RETURNING task_id, address, kind, origin, window_id, requested_at",
        (task_id, address, *kinds)).fetchone())


class RolloverStore:
    """The proxy's side: every read and write on its one database thread (never the event loop).

    Given a `backend` (a store other than the embedded one, proxy/store/interface.py: PostgreSQL), every call goes
    to it on a thread of its own instead, and nothing is trusted without asking: there is no stamp file another
    machine could move, so each request of a known session costs one indexed query."""

    EMPTY_KEPT = 4096  # agents whose last "nothing pending" is remembered

    def __init__(self, worker: DBWorker | None, db_path: Path | None = None, backend: RolloverBackend | None = None):
        self.worker = worker
        self.backend = backend
        self._ensured = False
        self._db_path = db_path
        self._reader: sqlite3.Connection | None = None
        self._empty: OrderedDict[tuple[str, str], tuple[bytes, float]] = OrderedDict()
        self._stamp: StampView | None = None

    def may_be_pending(self, task_id: str, address: str) -> bool:
        """Whether `take` could find anything for the agent (False: it would answer None), without the database
        thread (see `_maybe_pending`)."""
        return self._maybe_pending(task_id, address)

    def _maybe_pending(self, task_id: str, address: str) -> bool:
        """Whether the agent may have a pending rollover. Nothing pending, found under the stamp that is still
        there (and not long ago), is the answer again without a query; else it is read on the caller's own
        read-only connection: in WAL mode a reader never waits for a writer, so a request with nothing pending
        (nearly all of them) costs no trip to the database thread. Committed marks are always seen (the stamp
        is read before the query, and a mark stamps after its commit); when it cannot tell, it says maybe."""
        if self._db_path is None or self.backend is not None:
            return True
        key = (task_id, address)
        if self._stamp is None:
            self._stamp = StampView(self._db_path)
        stamp = self._stamp.value()  # before the query: a mark committed after it moves the stamp after it
        now = time.monotonic()
        known = self._empty.get(key)
        if known is not None and stamp is not None and known[0] == stamp:
            if now - known[1] < EMPTY_TRUSTED_FOR:
                return False
            self._stamp.revalidate()  # (trust ran out: also make sure the file mapped is the one writers write)
            stamp = self._stamp.value()
        try:
            if self._reader is None:
                self._reader = sqlite3.connect(f"file:{self._db_path}?mode=ro", uri=True, check_same_thread=False)
            found = self._reader.execute("SELECT 1 FROM context_rollovers WHERE task_id=? AND address=? LIMIT 1",
                                         (task_id, address)).fetchone() is not None
        except sqlite3.Error:  # no table yet, a busy WAL reset, no database file: ask the worker
            return True
        self._empty.pop(key, None)
        if not found and stamp is not None:
            self._empty[key] = (stamp, now)
            while len(self._empty) > self.EMPTY_KEPT:
                self._empty.popitem(last=False)
        return found

    def _ensure(self, conn: sqlite3.Connection) -> None:
        if not self._ensured:  # the worker's connection may predate this module's schema
            ensure(conn)
            self._ensured = True

    async def take(self, task_id: str, address: str, kinds: tuple[Kind, ...] = KINDS) -> Pending | None:
        if self.backend is not None:
            return await asyncio.to_thread(self.backend.take, task_id, address, kinds)
        if not self._maybe_pending(task_id, address):
            return None

        def run(conn: sqlite3.Connection) -> Pending | None:
            self._ensure(conn)
            return take_pending(conn, task_id, address, kinds)

        return await self._worker().run(run)

    async def peek(self, task_id: str, address: str) -> Pending | None:
        if self.backend is not None:
            return await asyncio.to_thread(self.backend.peek, task_id, address)
        return await self._worker().run(lambda conn: peek_pending(conn, task_id, address))

    async def mark(self, task_id: str, address: str, kind: Kind = "new_context", origin: str = "proxy",
                   window_id: str | None = None) -> Pending:
        if self.backend is not None:
            return await asyncio.to_thread(self.backend.mark, task_id, address, kind, origin, window_id)
        return await self._worker().run(lambda conn: mark_pending(conn, task_id, address, kind, origin, window_id))

    def _worker(self) -> DBWorker:
        assert self.worker is not None, "an embedded RolloverStore needs its database worker"
        return self.worker
