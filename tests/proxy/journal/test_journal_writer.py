"""The journal's writer thread: sleeping while idle, woken once per burst (by a loop timer on an event
loop), flush, a full queue; and the hash-chain ids staying what they always were."""

from __future__ import annotations

import asyncio
import hashlib
import sqlite3
import threading
import time
from pathlib import Path

import orjson
import pytest

from proxy.items.canonical import canonical_hash, chain_id, session_root
from proxy.journal import Journal
from proxy.journal import sqlite_backend as backend_mod
from proxy.journal.ops import EnsureTask, PutEvent
from proxy.journal.writer import JournalWriter
from proxy.session import SessionIdentity
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


def test_ids_are_the_sha256_chain_they_always_were():
    item = {"role": "user", "content": "hi", "id": "msg_1"}
    canon_bytes = orjson.dumps({"content": [{"text": "hi", "type": "input_text"}], "role": "user",
                                "type": "message"})
    canon = hashlib.sha256(canon_bytes).hexdigest()
    assert canonical_hash(item) == canon
    parent = session_root("f:x")
    assert chain_id(parent, canon) == "it_" + hashlib.sha256(f"{parent}\x00{canon}".encode()).hexdigest()[:16]


def test_an_idle_writer_sleeps_and_a_burst_wakes_it(db: Path):
    """Behaviour, not scheduling: idle, it parks without draining; a burst gets committed without a flush.
    (How many wake-ups a burst costs depends on the machine's load, so it is not asserted.)"""
    w = JournalWriter(db, batch_interval=0.05)
    try:
        assert _wait(lambda: w._parked)
        assert w.stats.drains == 0  # no ticking while there is nothing to do
        for i in range(20):  # a burst from a thread without an event loop
            w.submit(EnsureTask(f"t{i}", "session", float(i)))
        assert _wait(lambda: len(_tasks(db)) == 20)  # committed without a flush
        assert w.stats.wakeups >= 1
        assert _tasks(db) == [f"t{i}" for i in range(20)]
        assert w.pending == 0
        assert _wait(lambda: w._parked)  # and back to sleep
    finally:
        w.close()


async def test_on_an_event_loop_a_timer_rings_the_writer_not_the_request_path(tmp_path: Path):
    """The request path only snapshots and schedules a ring; the loop timer's ring gets it committed.
    Pinned as behaviour, not as wake-up counts (those depend on the machine's scheduling)."""
    state = StateDir.open(tmp_path / "state")
    j = Journal(state, JournalWriter(state.db_path, batch_interval=0.05, index_delay=3600))
    try:
        key, task, addr = j.resolve(SessionIdentity("f:loop", "fingerprint", None, None), {}, {})
        j.begin_request(key, task, addr, "fingerprint", {"input": "warm up"})  # creates the session
        assert j.flush()
        # Holding the journal's lock keeps the writer from settling (it never waits for it), so what is
        # seen here is what the request path did, however the threads are scheduled.
        with j._lock:
            mark = j.begin_request(key, task, addr, "fingerprint", {"input": [
                {"role": "user", "content": "warm up"}, {"role": "user", "content": "hi"}]})
            j.end_response(mark, [{"type": "message", "role": "assistant", "content": "yo"}], response_id="r1",
                           model=None, status=None, usage=None, error=None, incomplete=False)
            assert j._ring_due  # a loop timer will ring the writer
            assert len(j._backlog) == 2 and not mark.settled  # the request path did not do the work
        conn = sqlite3.connect(j.state.db_path)
        count = "SELECT count(*) FROM journal_items"
        # The loop timer rings it: settled and committed without a flush or a read.
        assert await _await(lambda: conn.execute(count).fetchone()[0] == 3)
        assert mark.kind == "continue"
        assert await _await(lambda: not j._ring_due)
        conn.close()
    finally:
        j.close()


async def _await(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        await asyncio.sleep(0.01)
    return cond()


def test_flush_commits_everything_submitted_before_it_in_order(db: Path):
    w = JournalWriter(db, batch_size=8, batch_interval=5.0)
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
    real = backend_mod.apply_batch

    def stalled(conn, ops, between=None):
        release.wait(10)
        return real(conn, ops, between)

    monkeypatch.setattr(backend_mod, "apply_batch", stalled)  # the embedded backend's batches (the writer's)
    w = JournalWriter(db, batch_interval=0.01, queue_max=4, full_wait=0.2)
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


def test_a_unit_bigger_than_the_queue_is_committed_not_dropped(db: Path):
    """One request of more items than the queue holds (a 100,000-item input is 100,001 ops with its branch)
    goes in once the queue is empty; before, it waited for room it could never have and was dropped whole."""
    w = JournalWriter(db, batch_interval=0.01, queue_max=4, full_wait=0.5)
    try:
        w.submit_many([PutEvent("s", "e", {"i": i}, 1.0) for i in range(10)])
        assert w.stats.dropped == 0
        assert w.flush()
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT count(*) FROM journal_events").fetchone()[0] == 10
        conn.close()
    finally:
        w.close()


async def test_a_blocked_loop_does_not_hold_the_journal_back(tmp_path: Path):
    """The loop timer cannot run while the loop is blocked: the next hand-over rings the writer itself."""
    state = StateDir.open(tmp_path / "state")
    j = Journal(state, JournalWriter(state.db_path, batch_interval=0.02))
    try:
        key, task, addr = j.resolve(SessionIdentity("f:blocked", "fingerprint", None, None), {}, {})
        conn = sqlite3.connect(state.db_path)
        history: list[dict] = []
        for i in range(6):  # never awaiting: the loop's timers do not run
            history.append({"role": "user", "content": f"q{i}"})
            j.begin_request(key, task, addr, "fingerprint", {"input": list(history)})
            time.sleep(0.03)
        assert _wait(lambda: conn.execute("SELECT count(*) FROM journal_items").fetchone()[0] >= 5)
        conn.close()
    finally:
        j.close()


def test_two_processes_index_each_item_once(tmp_path: Path):
    from proxy.journal.sqlite_backend import index_text

    state = StateDir.open(tmp_path / "state")
    journals = [Journal(state, JournalWriter(state.db_path, index_items=3, index_delay=3600)) for _ in range(2)]
    try:
        for n, j in enumerate(journals):
            key, task, addr = j.resolve(SessionIdentity(f"f:p{n}", "fingerprint", None, None), {}, {})
            st = j.session(key, task, addr)
            for i in range(7):
                mark = j.ingest_request(st, {"input": [{"role": "user", "content": f"needle {n}.{i}"}],
                                             "previous_response_id": f"p{n}.{i - 1}" if i else None})
                j.ingest_response(mark, [], response_id=f"p{n}.{i}", model=None, status=None, usage=None,
                                  error=None, incomplete=False)
        for j in journals:
            assert j.flush()
    finally:
        for j in journals:
            j.close()
    conn = sqlite3.connect(state.db_path)
    index_text(conn)
    matches = conn.execute("""SELECT rowid FROM journal_fts WHERE journal_fts MATCH '"needle"'""").fetchall()
    assert len(matches) == len(set(matches)) == 14
    conn.close()


def test_the_writer_never_waits_for_a_thread_holding_the_journal(tmp_path: Path):
    state = StateDir.open(tmp_path / "state")
    j = Journal(state, JournalWriter(state.db_path, batch_interval=0.01))
    try:
        key, task, addr = j.resolve(SessionIdentity("f:held", "fingerprint", None, None), {}, {})
        with j._lock:  # e.g. a reader settling, itself waiting for room in the writer's queue
            j.begin_request(key, task, addr, "fingerprint", {"input": "hi"})
            j.record_event(key, "note", {})
            assert j.writer.flush(timeout=5)  # drained what it had, without the backlog
            assert j._backlog
        assert j.flush() and not j._backlog
    finally:
        j.close()


def test_a_mark_read_while_another_thread_journals_its_entry_waits_for_it(tmp_path: Path, monkeypatch):
    """`settle` promises every caller finds the backlog journaled on return. When another thread (the writer)
    has taken the last entry and is aligning it, the backlog is already empty: a reader of that request's mark
    must wait for the alignment, not read ids that are not there yet (found under load: a request then got no
    [id: …] markers)."""
    state = StateDir.open(tmp_path / "state")
    j = Journal(state, JournalWriter(state.db_path, batch_interval=0.01))
    inside, go = threading.Event(), threading.Event()
    real_align = Journal._align

    def slow_align(self, p):
        inside.set()
        assert go.wait(30)
        return real_align(self, p)

    try:
        key, task, addr = j.resolve(SessionIdentity("f:race", "fingerprint", None, None), {}, {})
        monkeypatch.setattr(Journal, "_align", slow_align)
        mark = j.begin_request(key, task, addr, "fingerprint", {"input": [{"role": "user", "content": "hi"}]})
        other = threading.Thread(target=j.settle, kwargs={"wait": False})  # as the writer drains
        other.start()
        assert inside.wait(30) and not j._backlog  # it has taken the entry
        read: list[list[str]] = []
        reader = threading.Thread(target=lambda: read.append(list(mark.input_ids)))
        reader.start()
        go.set()
        reader.join(30)
        other.join(30)
        assert read and len(read[0]) == 1 and read[0][0]  # the id, not an empty list
    finally:
        go.set()
        j.close()


def test_barriers_in_a_drain_do_not_split_its_transaction(db: Path):
    """Every new session leaves a barrier (its registration's); a burst of them went out as one transaction per
    session. A barrier is released with the commit that takes its ops, and what follows it goes in the same one."""

    class Recording(backend_mod.SqliteJournal):
        def __init__(self, path: Path):
            super().__init__(path)
            self.batches: list[tuple[list[str], list[bool]]] = []

        def apply(self, ops, stamp=None):
            self.batches.append(([op.task_id for op in ops], [ev.is_set() for ev in events]))
            return super().apply(ops, stamp)

    events: list[threading.Event] = []
    backend = Recording(db)
    backend.open()
    w = JournalWriter(backend, batch_interval=30.0)  # a burst gathers: only the flush below ends it
    try:
        for i in range(5):
            w.submit_many([EnsureTask(f"task_{i}", "session", float(i))])
            events.append(w.barrier())
        w.submit(EnsureTask("task_after", "session", 9.0))
        assert w.flush(timeout=30)
        assert backend.batches == [([*(f"task_{i}" for i in range(5)), "task_after"], [False] * 5)]
        assert all(ev.is_set() for ev in events)
        assert sorted(_tasks(db)) == sorted([*(f"task_{i}" for i in range(5)), "task_after"])
    finally:
        w.close()


def test_a_barrier_is_released_only_once_what_precedes_it_is_committed(db: Path):
    """A batch cut at `batch_size` releases the barriers before the cut with its commit, not earlier."""
    seen: list[tuple[list[str], bool]] = []

    class Recording(backend_mod.SqliteJournal):
        def apply(self, ops, stamp=None):
            seen.append(([op.task_id for op in ops], ev.is_set()))
            return super().apply(ops, stamp)

    backend = Recording(db)
    backend.open()
    w = JournalWriter(backend, batch_size=2, batch_interval=30.0)
    try:
        w.submit_many([EnsureTask("a", "session", 0.0), EnsureTask("b", "session", 0.0)])
        ev = w.barrier()
        w.submit_many([EnsureTask("c", "session", 1.0)])
        assert w.flush(timeout=30)
        assert seen == [(["a", "b"], False), (["c"], True)]
        assert ev.is_set()
    finally:
        w.close()


def test_after_big_work_the_writer_frees_its_connections_caches_once_idle(db: Path):
    """A big request's items and their full-text indexing fill the writer connection's page cache and FTS5's
    buffers (≈6 MB of the writer thread's heap stayed resident after idle): once it has nothing pending and the
    index has caught up, the writer has the backend free them (PRAGMA shrink_memory), once per big batch of work."""
    from proxy.journal import writer as writer_mod

    class Recording(backend_mod.SqliteJournal):
        def __init__(self, path: Path):
            super().__init__(path)
            self.releases = 0
            self.report: int = 0  # items the next batch says it inserted

        def apply(self, ops, stamp=None):
            super().apply(ops, stamp)
            return self.report

        def release_memory(self):
            super().release_memory()  # the real pragma, on the writer's real connection
            self.releases += 1

    backend = Recording(db)
    backend.open()
    w = JournalWriter(backend, index_delay=0.01)
    try:
        backend.report = writer_mod.BIG_WRITE_ITEMS // 2
        w.submit(EnsureTask("task_small", "session", 1.0))
        assert w.flush(timeout=30) and w.flush(timeout=30)  # (the second: the first's loop turn has ended)
        assert backend.releases == 0  # small work: nothing to free
        backend.report = writer_mod.BIG_WRITE_ITEMS
        w.submit(EnsureTask("task_big", "session", 2.0))
        deadline = time.monotonic() + 60
        while backend.releases == 0 and time.monotonic() < deadline:
            w.ring()
            time.sleep(0.01)
        assert backend.releases == 1 and w.stats.memory_releases == 1
        backend.report = 0
        w.submit(EnsureTask("task_after", "session", 3.0))
        assert w.flush(timeout=30) and w.flush(timeout=30)
        assert backend.releases == 1  # counted again from zero
        assert sorted(_tasks(db)) == ["task_after", "task_big", "task_small"]
    finally:
        w.close()
