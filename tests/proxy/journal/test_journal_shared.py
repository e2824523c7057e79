"""Several processes journal the same sessions (`ctproxy up --workers N`): two `Journal`s on one state
directory stand for two workers. The database is the lock: each writer stamps the sessions it changes, a
journal reloads a session whose stamp is another's, and branch appends merge instead of cutting back."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.journal import Journal
from proxy.journal.ops import EnsureSession, SetBranch
from proxy.journal.sqlite_backend import apply_batch
from proxy.state import StateDir


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[Journal, Journal]]:
    state = StateDir.open(tmp_path / "state")
    a, b = Journal(state, shared=True), Journal(state, shared=True)
    yield a, b
    a.close()
    b.close()


def _msg(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def _out(text: str, n: int) -> dict:
    return {"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _resent(text: str) -> dict:
    return {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}


def _turn(j: Journal, key: str, task: str, history: list[dict], n: int) -> None:
    st = j.session(key, task, "/root", "fingerprint")
    history.append(_msg("user", f"question {n}"))
    mark = j.ingest_request(st, {"input": list(history)})
    j.ingest_response(mark, [_out(f"answer {n}", n)], response_id=f"resp_{n}", model="gpt-5", status="completed",
                      usage=None, error=None, incomplete=False)
    history.append(_resent(f"answer {n}"))
    assert j.flush()


def _branch_texts(state: StateDir, key: str) -> list[str]:
    conn = sqlite3.connect(state.db_path)
    try:
        return [r[0] for r in conn.execute("SELECT i.text FROM journal_branch b JOIN journal_items i ON"
                                           " i.item_id = b.item_id WHERE b.session_key=? ORDER BY b.pos", (key,))]
    finally:
        conn.close()


def test_turns_alternating_between_two_journals_are_one_session_in_order(pair):
    a, b = pair
    task = a.create_task()
    history: list[dict] = []
    for n in range(8):
        _turn(a if n % 2 == 0 else b, "f:conv", task, history, n)
    expected = [t for n in range(8) for t in (f"question {n}", f"answer {n}")]
    assert _branch_texts(a.state, "f:conv") == expected
    conn = sqlite3.connect(a.state.db_path)
    assert conn.execute("SELECT count(*) FROM journal_items").fetchone()[0] == 16  # each item once
    assert conn.execute("SELECT count(*) FROM journal_branch_heads").fetchone()[0] == 0  # nothing was cut back
    assert conn.execute("SELECT count(*) FROM journal_sessions").fetchone()[0] == 1
    # A cached state catches up with what the other wrote when a request next uses it.
    assert a.refresh(a.session("f:conv")) and not b.refresh(b.session("f:conv"))
    assert len(a.session("f:conv").entries) == len(b.session("f:conv").entries) == 16


def test_a_window_opened_by_one_journal_is_seen_by_the_other(pair):
    a, b = pair
    task = a.create_task()
    history: list[dict] = []
    _turn(a, "f:w", task, history, 0)
    _turn(b, "f:w", task, history, 1)  # b caches the session now
    opened = a.start_window("f:w", None, "notes", {"note": "checkpoint"})
    assert a.flush()
    _turn(b, "f:w", task, history, 2)  # b's next request sees a's window
    assert b.window_of("f:w").window_id == opened.window_id
    later = b.start_window("f:w", None, "fallback", {"text": "x"})  # and numbers its own after it
    assert later.ordinal == opened.ordinal + 1
    assert b.flush()
    assert [w.window_id for w in a.windows("f:w")][-2:] == [opened.window_id, later.window_id]


def test_an_append_does_not_cut_back_what_another_writer_appended(tmp_path: Path):
    """Two workers journal the same turn: the later commit of the shorter append keeps the longer branch."""
    from proxy.db import connect

    state = StateDir.open(tmp_path / "state")
    Journal(state).close()  # the schema
    conn = connect(state.db_path)
    apply_batch(conn, [EnsureSession("s", "t", "/root", None, 0.0), SetBranch("s", 0, ("a", "b"))], stamp="w1")
    apply_batch(conn, [SetBranch("s", 2, ("c", "d", "e"))], stamp="w2")  # worker 2: the turn and its answer
    apply_batch(conn, [SetBranch("s", 2, ("c", "d"))], stamp="w1")  # worker 1's commit of the same turn, later
    assert [r[0] for r in conn.execute("SELECT item_id FROM journal_branch ORDER BY pos")] == list("abcde")
    apply_batch(conn, [SetBranch("s", 3, ("d", "e", "f"))], stamp="w1")  # extends it: only the rest is written
    assert [r[0] for r in conn.execute("SELECT item_id FROM journal_branch ORDER BY pos")] == list("abcdef")
    apply_batch(conn, [SetBranch("s", 2, ("x",))], stamp="w2")  # disagrees: the latest wins, as in one process
    assert [r[0] for r in conn.execute("SELECT item_id FROM journal_branch ORDER BY pos")] == list("abx")
    stamps = conn.execute("SELECT writer, n FROM journal_session_stamps WHERE session_key='s'").fetchone()
    assert tuple(stamps) == ("w2", 5)
