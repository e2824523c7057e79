"""The journal's writer thread: handing ops over without waking it, ticks, parking, flush, a full queue;
and the hash-chain ids staying what they always were."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from proxy.journal import writer as writer_mod
from proxy.journal.canonical import canonical_hash, chain_id, session_root
from proxy.journal.ops import EnsureTask, PutEvent
from proxy.journal.writer import JournalWriter
from proxy.state import StateDir


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return StateDir.open(tmp_path / "state").db_path


def _tasks(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [r[0] for r in conn.execute("SELECT task_id FROM journal_tasks ORDER BY created_at")]
    finally:
        conn.close()


def _wait(cond, timeout: float = 10.0) -> bool:
    """Poll for a background effect (generous timeout: this checks that it happens, not how fast)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


@pytest.fixture
def writer(db: Path) -> Iterator[JournalWriter]:
    w = JournalWriter(db, batch_interval=0.01, park_after=30.0)
    yield w
    w.close()


def test_ids_are_the_sha256_chain_they_always_were():
    item = {"role": "user", "content": "hi", "id": "msg_1"}
    canon_bytes = orjson.dumps({"content": [{"text": "hi", "type": "input_text"}], "role": "user",
                                "type": "message"})
    canon = hashlib.sha256(canon_bytes).hexdigest()
    assert canonical_hash(item) == canon
    parent = session_root("f:x")
    assert chain_id(parent, canon) == "it_" + hashlib.sha256(f"{parent}\x00{canon}".encode()).hexdigest()[:16]


def test_submits_while_ticking_never_wake_the_writer(writer: JournalWriter, db: Path):
    for i in range(50):
        writer.submit(EnsureTask(f"t{i}", "session", float(i)))
        time.sleep(0.002)
    # Committed on the writer's own clock, without a flush and without one wake-up from a submit.
    assert _wait(lambda: len(_tasks(db)) == 50)
    assert writer.stats.wakeups == 0
    assert _tasks(db) == [f"t{i}" for i in range(50)]
    assert writer.pending == 0


def test_a_parked_writer_is_woken_once_by_the_next_submit(db: Path):
    w = JournalWriter(db, batch_interval=0.01, park_after=0.05)
    try:
        assert _wait(lambda: w._parked)  # idle: it stopped ticking
        w.submit(EnsureTask("late", "session", 1.0))
        assert _wait(lambda: _tasks(db) == ["late"])  # no flush: the submit woke it
        assert w.stats.wakeups == 1
    finally:
        w.close()


def test_flush_commits_everything_submitted_before_it_in_order(db: Path):
    w = JournalWriter(db, batch_size=8, batch_interval=5.0, park_after=30.0)
    try:
        for i in range(5):  # units of 3 ops: a transaction holds whole units, at most 8 ops (or one unit)
            w.submit_many([EnsureTask(f"t{i}.{k}", "session", i * 10 + k) for k in range(3)])
        w.submit_many([EnsureTask(f"big.{k}", "session", 100 + k) for k in range(12)])
        assert w.flush()  # long interval: only the flush can have committed these
        assert len(_tasks(db)) == 27
        assert w.stats.max_batch == 12 and w.stats.batches == 4
    finally:
        w.close()
    with pytest.raises(RuntimeError):
        w.submit(EnsureTask("after", "session", 0.0))
    assert not w.flush()


def test_a_full_queue_waits_then_drops_and_the_writer_recovers(db: Path, monkeypatch):
    release = threading.Event()
    real = writer_mod.apply_batch

    def stalled(conn, ops, between=None):
        release.wait(10)
        return real(conn, ops, between)

    monkeypatch.setattr(writer_mod, "apply_batch", stalled)
    w = JournalWriter(db, batch_interval=0.01, queue_max=4, full_wait=0.2, park_after=30.0)
    try:
        w.submit(EnsureTask("first", "session", 0.0))
        assert _wait(lambda: w.pending == 0)  # taken: the writer is now stuck committing it
        for i in range(4):
            w.submit(PutEvent("s", "e", {"i": i}, 1.0))
        assert w.pending == 4
        w.submit(PutEvent("s", "e", {"i": 4}, 1.0))  # no room: waits full_wait, then drops
        assert w.stats.dropped == 1
        release.set()
        assert w.flush()
        assert _tasks(db) == ["first"]
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT count(*) FROM journal_events").fetchone()[0] == 4
        conn.close()
    finally:
        release.set()
        w.close()
