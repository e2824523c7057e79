"""`ctproxy store migrate --to URL` (issue 32): an embedded state directory — journal, windows, rollovers, notes —
copied into a real (private) PostgreSQL with nothing lost, its schema made by versioned migrations, and the
journal's literal substring search answered there by pg_trgm, verified against the text."""

from __future__ import annotations

import itertools
import sqlite3
import subprocess
import sys
from pathlib import Path

from proxy.journal import Journal
from proxy.journal.query import ItemFilter
from proxy.notes.store import NotesStore
from proxy.state import StateDir
from proxy.store import postgres as pgstore

REPO = Path(__file__).resolve().parents[3]
_COUNT = itertools.count()


def _embedded_state(root: Path) -> StateDir:
    state = StateDir.open(root)
    j = Journal(state)
    try:
        task = j.create_task()
        st = j.session("f:conv", task, "/root", "fingerprint")
        history: list[dict] = [{"role": "user", "content": "Weather in Paris? 50% off_sale \\ backslash"}]
        mark = j.ingest_request(st, {"input": list(history)})
        out = [{"type": "function_call", "call_id": "call_w", "name": "get_weather", "arguments": '{"city":"Paris"}'}]
        j.ingest_response(mark, out, response_id="resp_1", model="gpt-5", status="completed",
                          usage={"input_tokens": 10, "output_tokens": 2}, error=None, incomplete=False)
        history += [*out, {"type": "function_call_output", "call_id": "call_w", "output": '{"sky":"clear"}'}]
        mark = j.ingest_request(st, {"input": list(history)})
        j.ingest_response(mark, [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "It is sunny in Paris."}]}], response_id="resp_2", model="gpt-5",
            status="completed", usage=None, error=None, incomplete=False)
        j.start_window("f:conv", None, "notes", {"note": "checkpoint"})
        assert j.flush()
    finally:
        j.close()
    from proxy.db import connect
    from proxy.windows.notes import rollover

    conn = connect(state.db_path)
    rollover.ensure(conn)
    rollover.mark_pending(conn, task, "/root/helper", "new_context", "tool")
    from proxy.usage import record_estimate

    record_estimate(conn, "f:conv", task, "/root", "gpt-5", 1234)
    conn.close()
    from proxy.store.embedded import EmbeddedStore

    embedded = EmbeddedStore(state)  # compaction's records, one row or more in each of its tables
    rec = embedded.compaction()
    rec.record_forwarded("f:conv", "cp_copied", 4, 2048)
    rec.mark_failed("f:conv", 4)
    rec.record_compacted("f:conv", 3)
    rec.record_event("f:conv", "compaction", "fallback", "threshold", "cp_copied")
    rec.record_event("f:conv", "recovery", "recovered", "remote", "cp_copied")
    rec.learn_window("gpt-5", "https://api.example/v1/responses", 96_000)
    embedded.close()
    notes = NotesStore(state.subdir("notes"), task)
    notes.write("/root", "checkpoint.md", "checkpoint: half done\n")
    notes.write("/root", "deep/dir/plan.md", "step 1\nstep 2 — ünïcode\n")
    return state


def _rows(conn, table: str, cols: list[str]) -> list[tuple]:
    rows = conn.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall()
    return sorted((tuple(bytes(v) if isinstance(v, memoryview | bytearray) else v for v in r) for r in rows),
                  key=repr)


def _migrate(state: StateDir, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.app.cli", "store", "migrate", "--to", url, "--state-dir",
                           str(state.root)], capture_output=True, text=True, cwd=REPO, timeout=180)


def test_store_migrate_copies_everything_and_search_works_there(pg, tmp_path):
    import psycopg

    state = _embedded_state(tmp_path / "state")
    url = pg.fresh_database(f"migrate{next(_COUNT)}")
    out = _migrate(state, url)
    assert out.returncode == 0, out.stderr
    assert "schema migrations applied: 1" in out.stdout

    src = sqlite3.connect(state.db_path)
    tables = {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    copied = 0
    with psycopg.connect(url) as dst:
        for table in pgstore.TABLES:
            if table not in tables:
                continue
            cols = [r[1] for r in src.execute(f"PRAGMA table_info({table})")]
            mine = _rows(src, table, cols)
            theirs = _rows(dst, table, cols)
            assert theirs == mine, table  # every row, every column, byte for byte
            copied += len(mine)
        assert copied > 20
        notes = dst.execute("SELECT address, path, content FROM notes_files ORDER BY path").fetchall()
        assert [(a, p, bytes(c)) for a, p, c in notes] == [
            ("/root", "checkpoint.md", b"checkpoint: half done\n"),
            ("/root", "deep/dir/plan.md", "step 1\nstep 2 — ünïcode\n".encode())]
        assert dst.execute("SELECT version FROM ctp_schema_versions WHERE name = 'store'").fetchone()[0] == \
            pgstore.MIGRATIONS[-1][0]
        assert dst.execute("SELECT input_tokens FROM usage_estimates").fetchall() == [(1234,)]
        assert pgstore.migrate(dst) == []  # up to date: nothing applied twice
        assert dst.execute("SELECT count(*) FROM context_rollovers WHERE address = '/root/helper'").fetchone()[0] == 1
    src.close()

    # Literal, case-sensitive substring search over the migrated journal (pg_trgm, verified against the text).
    found = [text for _, text in pgstore.search_items(url, "Paris")]
    assert any(t.startswith("Weather in Paris?") for t in found) and "It is sunny in Paris." in found
    assert [t for _, t in pgstore.search_items(url, "0% off_")] == [found[0]]
    assert pgstore.search_items(url, "paris") == []
    assert [t for _, t in pgstore.search_items(url, "\\ back")] == [found[0]]

    # The copied journal is served from PostgreSQL as it was from the embedded store: the session, its branch in
    # order, its windows and aliases; and it goes on (items and events numbered after the copied ones).
    from proxy.store.pg import PostgresStore

    before = Journal(state)
    try:
        task = before.backend.session("f:conv")[0]
        ids, windows = before.item_ids_for_session("f:conv"), [w.window_id for w in before.windows("f:conv")]
        texts = [r.text for r in before.backend.history().list_items(task, "/root", ItemFilter(), 100, False,
                                                                       1000)[0]]
    finally:
        before.close()
    store = PostgresStore.open(url, max_size=4)
    served = Journal(StateDir.open(tmp_path / "elsewhere"), backend=store.journal())
    try:
        assert served.item_ids_for_session("f:conv") == ids and len(ids) == 4
        assert [w.window_id for w in served.windows("f:conv")] == windows == ["w1", "w2"]
        assert served.session_for_response("resp_2") == "f:conv"
        reader = store.journal().history()
        assert [r.text for r in reader.list_items(task, "/root", ItemFilter(), 100, False, 1000)[0]] == texts
        assert [h.row.text for h in reader.search(task, "/root", "sunny", ItemFilter(), 10, False)[0]] == \
            ["It is sunny in Paris."]
        st = served.session("f:conv")
        resent = [*served.raw_items(ids), {"role": "user", "content": "and tomorrow?"}]  # the whole conversation
        assert len(resent) == 5
        mark = served.ingest_request(st, {"input": resent})
        served.ingest_response(mark, [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "Rain."}]}], response_id="resp_3", model="gpt-5", status="completed",
            usage=None, error=None, incomplete=False)
        served.record_event("f:conv", "after_copy", {})
        assert served.flush()
        assert len(served.item_ids_for_session("f:conv")) == 6
        assert served.events("f:conv")[-1]["kind"] == "after_copy"
        assert served.window_of("f:conv").window_id == "w2"
        # Compaction's records came along, and go on: events numbered after the copied ones.
        rec = store.compaction()
        got = rec.session_state("f:conv")
        assert got is not None and (got.last.checkpoint_id, got.last.client_items, got.last.sent_bytes,
                                    got.failed_items, got.compacted_items) == ("cp_copied", 4, 2048, 4, 3)
        assert rec.learned_window("gpt-5", "https://api.example/v1/responses") == 96_000
        rec.record_event("f:conv", "compaction", "remote", "after_copy", "cp_next")
        assert [(e.kind, e.outcome, e.checkpoint_id) for e in rec.events("f:conv")] == [
            ("compaction", "fallback", "cp_copied"), ("recovery", "recovered", "cp_copied"),
            ("compaction", "remote", "cp_next")]
    finally:
        served.close()
        store.close()

    # Nothing is merged: a second copy into the same database is refused, and leaves it as it was.
    again = _migrate(state, url)
    assert again.returncode == 1 and "already holds" in again.stderr
    with psycopg.connect(url) as dst:
        assert dst.execute("SELECT count(*) FROM notes_files").fetchone()[0] == 2


def test_store_migrate_says_what_is_wrong(pg, tmp_path):
    state = _embedded_state(tmp_path / "state")
    bad = _migrate(state, "mysql://nobody@127.0.0.1/x")
    assert bad.returncode == 1 and "not a PostgreSQL URL" in bad.stderr
    down = _migrate(state, f"postgresql://ctproxy@127.0.0.1:{pg.port}/no_such_db")
    assert down.returncode == 1 and "cannot connect to PostgreSQL" in down.stderr


def test_a_database_at_migration_1_is_brought_up_to_date_step_by_step(pg, monkeypatch):
    import psycopg

    url = pg.fresh_database(f"steps{next(_COUNT)}")
    with monkeypatch.context() as m:
        m.setattr(pgstore, "MIGRATIONS", pgstore.MIGRATIONS[:1])
        with psycopg.connect(url) as conn:
            assert pgstore.migrate(conn) == [1]
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT to_regclass('usage_estimates')").fetchone()[0] is None
        assert pgstore.migrate(conn) == [v for v, _ in pgstore.MIGRATIONS[1:]]
        assert conn.execute("SELECT to_regclass('usage_estimates')").fetchone()[0] == "usage_estimates"
        assert pgstore.migrate(conn) == []
