"""The pending-rollover check of every request answers "nothing pending" from a stamp file while no mark was made
since it last asked the database (proxy/windows/notes/rollover.py): a mark from any process is seen at the next
check."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from proxy.db import connect
from proxy.dbworker import DBWorker
from proxy.windows.notes import rollover


class _Counting:
    """The read-only connection, counting its queries."""

    def __init__(self, conn: sqlite3.Connection):
        self.conn, self.queries = conn, 0

    def execute(self, *args):
        self.queries += 1
        return self.conn.execute(*args)


@pytest.fixture
def store(tmp_path):
    db = tmp_path / "ctproxy.db"
    other = connect(db)  # another process's connection (the tool server's, the CLI's)
    rollover.ensure(other)
    worker = DBWorker(db)
    st = rollover.RolloverStore(worker, db)
    assert st._maybe_pending("task_1", "/root") is False  # the first check opens the reader and the stamp
    st._reader = _Counting(st._reader)
    yield st, other
    worker.close()
    other.close()


def test_nothing_pending_is_answered_without_a_query_until_a_mark(store):
    st, other = store
    for _ in range(3):
        assert st._maybe_pending("task_1", "/root") is False
    assert st._reader.queries == 0
    assert st._maybe_pending("task_1", "/child") is False  # another agent: asked once
    assert st._reader.queries == 1
    rollover.mark_pending(other, "task_1", "/root", "new_context", "tool")
    assert st._maybe_pending("task_1", "/root") is True  # seen at once, though nothing was asked of this process
    assert st._maybe_pending("task_1", "/child") is False  # the stamp moved: asked again, still nothing
    assert st._reader.queries == 3


def test_a_taken_rollover_is_asked_for_again_and_then_trusted(store):
    st, other = store
    rollover.mark_pending(other, "task_1", "/root", "checkpoint", "cli")
    assert st._maybe_pending("task_1", "/root") is True
    taken = asyncio.run(st.take("task_1", "/root"))
    assert taken is not None and taken.kind == "checkpoint"
    assert st._maybe_pending("task_1", "/root") is False  # (asked: the last answer was "pending")
    queries = st._reader.queries
    assert st._maybe_pending("task_1", "/root") is False
    assert st._reader.queries == queries


def test_a_mark_stamped_before_its_commit_is_seen_once_the_trust_runs_out(store, monkeypatch):
    st, other = store
    other.execute("BEGIN IMMEDIATE")  # a caller's own longer transaction: the stamp moves before the commit
    rollover.mark_pending(other, "task_1", "/root", "new_context", "tool")
    assert st._maybe_pending("task_1", "/root") is False  # not committed yet: nothing to see
    other.execute("COMMIT")
    assert st._maybe_pending("task_1", "/root") is False  # the stamp is the one read before: trusted for now
    monkeypatch.setattr(rollover, "EMPTY_TRUSTED_FOR", 0.0)
    assert st._maybe_pending("task_1", "/root") is True


def test_a_stamp_file_made_anew_is_mapped_again_once_the_trust_runs_out(store, monkeypatch):
    st, other = store
    rollover.stamp_path(st._db_path).unlink()  # (someone cleaned the state directory)
    rollover.mark_pending(other, "task_1", "/root", "new_context", "tool")  # a new file: not the one mapped
    assert st._maybe_pending("task_1", "/root") is False  # the mapped stamp did not move: trusted for now
    monkeypatch.setattr(rollover, "EMPTY_TRUSTED_FOR", 0.0)
    assert st._maybe_pending("task_1", "/root") is True
    monkeypatch.setattr(rollover, "EMPTY_TRUSTED_FOR", 2.0)
    asyncio.run(st.take("task_1", "/root"))
    assert st._maybe_pending("task_1", "/root") is False
    rollover.mark_pending(other, "task_1", "/root", "new_context", "tool")
    assert st._maybe_pending("task_1", "/root") is True  # the new file is the one mapped now


def test_without_a_stamp_every_check_asks(store, monkeypatch):
    st, other = store
    st._stamp.close()
    monkeypatch.setattr(rollover.StampView, "_open", lambda self: None)  # (a state directory it cannot write)
    for _ in range(2):
        assert st._maybe_pending("task_1", "/root") is False
    assert st._reader.queries == 2
    rollover.mark_pending(other, "task_1", "/root", "new_context", "tool")
    assert st._maybe_pending("task_1", "/root") is True


def test_a_stamp_is_a_memory_read_on_the_request_path(store, monkeypatch):
    """No system call (it would hand the GIL to the writer threads): neither `os.stat` nor a query."""
    import os

    st, _other = store
    assert st._maybe_pending("task_1", "/root") is False
    calls = []
    monkeypatch.setattr(os, "stat", lambda *a, **k: calls.append(a))
    for _ in range(3):
        assert st._maybe_pending("task_1", "/root") is False
    assert calls == [] and st._reader.queries == 0
