"""The shared database worker: coalesced last-value writes keep program order and are never lost."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

from proxy.app.runtime import Services
from proxy.db import connect
from proxy.dbworker import DBWorker, close_shared, shared


def _table(path: Path) -> None:
    conn = connect(path)
    conn.execute("CREATE TABLE IF NOT EXISTS kv(k TEXT PRIMARY KEY, v INTEGER)")
    conn.close()


def _put(k: str, v: int):
    def write(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO kv(k, v) VALUES (?, ?) ON CONFLICT(k) DO UPDATE SET v=excluded.v", (k, v))

    return write


def _rows(conn: sqlite3.Connection) -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute("SELECT k, v FROM kv")}


async def test_latest_write_per_key_wins_and_reads_see_pending_writes(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    _table(db)
    worker = DBWorker(db, batch_interval=60.0)  # the timer never fires during the test
    applied: list[int] = []
    for i in range(5):
        def write(conn: sqlite3.Connection, i: int = i) -> None:
            applied.append(i)
            _put("a", i)(conn)

        worker.put_latest("a", write)
    worker.put_latest("b", _put("b", 1))
    assert await worker.run(_rows) == {"a": 4, "b": 1}  # a read enqueued later sees them
    assert applied == [4]  # coalesced: only the newest write of a key ran
    worker.close()


async def test_a_later_plain_write_is_applied_after_pending_coalesced_ones(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    _table(db)
    worker = DBWorker(db, batch_interval=60.0)
    worker.put_latest("a", _put("a", 1))
    worker.submit(_put("a", 2))  # program order: this one is later, so it must win
    assert await worker.run(_rows) == {"a": 2}
    worker.close()


async def test_the_batch_commits_on_its_own_after_the_interval(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    _table(db)
    worker = DBWorker(db, batch_interval=0.01)
    worker.put_latest("a", _put("a", 7))
    reader = connect(db)
    for _ in range(200):  # another connection (another process, in real life) sees it soon
        if _rows(reader) == {"a": 7}:
            break
        await asyncio.sleep(0.01)
    assert _rows(reader) == {"a": 7}
    reader.close()
    worker.close()


def test_close_commits_what_is_pending(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    _table(db)
    services = Services()
    worker = shared(services, db)
    assert shared(services, db) is worker
    worker.put_latest("a", _put("a", 3))  # no event loop: written at once
    loop = asyncio.new_event_loop()
    try:
        async def pending() -> None:
            worker.put_latest("b", _put("b", 4))  # on a loop: waits for the batch timer

        loop.run_until_complete(pending())
    finally:
        loop.close()
    close_shared(services)
    close_shared(services)  # a second addon's `done`: nothing left to close
    reader = connect(db)
    assert _rows(reader) == {"a": 3, "b": 4}
    reader.close()


async def test_a_failing_write_does_not_lose_the_read(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    _table(db)
    worker = DBWorker(db, batch_interval=60.0)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO missing_table VALUES (1)")

    worker.put_latest("x", broken)
    assert await worker.run(_rows) == {}
    worker.close()


async def test_settled_waits_for_every_write_put_and_is_none_once_they_are_committed(tmp_path: Path) -> None:
    """What an answer's end waits for (`budget.committed`): None only when nothing put is left uncommitted, so
    that another connection (another process, in real life) reads every write once it returns."""
    db = tmp_path / "t.db"
    _table(db)
    worker = DBWorker(db, batch_interval=60.0)  # the batch timer never fires during the test
    reader = connect(db)
    assert worker.settled() is None  # nothing was ever put
    gate = threading.Event()
    worker.submit(lambda _conn: gate.wait(30))  # the thread is busy: the write below cannot be committed yet
    worker.put_latest("a", _put("a", 1))
    pending = worker.settled()
    assert pending is not None  # a write is pending: there is something to wait for
    gate.set()
    await pending
    assert _rows(reader) == {"a": 1}
    assert worker.settled() is None
    # On an idle thread the write may be committed before `settled` returns: then None is the truth (CI saw it).
    worker.put_latest("b", _put("b", 2))
    pending = worker.settled()
    if pending is not None:
        await pending
    assert _rows(reader) == {"a": 1, "b": 2}
    assert worker.settled() is None
    reader.close()
    worker.close()


async def test_flush_now_starts_the_commit_on_an_idle_thread_and_a_busy_one_gathers_the_burst(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    _table(db)
    worker = DBWorker(db, batch_interval=60.0)
    reader = connect(db)
    worker.put_latest("a", _put("a", 1))
    worker.flush_now()  # the thread is idle: handed over now, not `batch_interval` later
    assert not worker._pending
    for _ in range(500):
        if worker.settled() is None:
            break
        await asyncio.sleep(0.01)
    assert worker.settled() is None  # committed: an answer ending now does not even hand a job to the thread
    assert _rows(reader) == {"a": 1}

    gate = threading.Event()
    worker.submit(lambda _conn: gate.wait(30))  # the thread is busy
    worker.put_latest("b", _put("b", 2))
    worker.flush_now()
    worker.put_latest("c", _put("c", 3))
    worker.flush_now()
    assert len(worker._pending) == 2  # kept for one job together, behind the busy one
    waiting = worker.settled()
    assert waiting is not None and not worker._pending  # the end of an answer takes them both to the thread
    assert worker.settled() is not None  # handed over, not committed yet: a second answer's end waits too
    gate.set()
    await waiting
    assert _rows(reader) == {"a": 1, "b": 2, "c": 3}
    assert worker.settled() is None
    for _ in range(3):  # reads do not leave the worker unsettled once they are done
        assert await worker.run(_rows) == {"a": 1, "b": 2, "c": 3}
    assert worker.settled() is None
    reader.close()
    worker.close()
