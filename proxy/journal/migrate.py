"""Versioned migrations of the journal's part of the state database (run once per process and database).

Version 2, the one window model (ADR 0006): windows carry their boundary (position in the agent's
items + one-chain hash), reason and the remote strategy's opaque item; the compaction store's own
checkpoints (`compaction_checkpoints`, written by ctproxy before it) become windows:
- a checkpoint that opened a journal window fills that window's row (strategy, bootstrap, boundary);
- one that did not (history off, or its boundary was off the branch) becomes a window of its own.
Its boundary hash is recomputed in the one chain: the journal's id of the boundary item when the
journal holds the session's items and they hash (old chain) to the stored value; otherwise the old
hash is kept with its `v1:` prefix, which the projection checks with the old chain (nothing is lost,
and no boundary is trusted that was not verified). All in one transaction; a failure leaves the
database as it was.
"""

from __future__ import annotations

import sqlite3
import threading
from typing import Any

import orjson

from proxy.items.addresses import ROOT
from proxy.items.canonical import LEGACY_PREFIX, legacy_chain_hash
from proxy.journal.identity import auto_task_id
from proxy.journal.model import window_id

NAME = "journal"
VERSION = 2
_NEW_WINDOW_COLUMNS = (("boundary_pos", "INTEGER"), ("boundary_hash", "TEXT"), ("reason", "TEXT"),
                       ("opaque", "BLOB"))
_done: set[str] = set()
_lock = threading.Lock()


def _db_file(conn: sqlite3.Connection) -> str:
    for row in conn.execute("PRAGMA database_list"):
        if row[1] == "main":
            return str(row[2])
    return ""


def version(conn: sqlite3.Connection) -> int:
    try:
        row = conn.execute("SELECT version FROM ctp_schema_versions WHERE name=?", (NAME,)).fetchone()
    except sqlite3.OperationalError:  # a database from before versions were kept
        return 1
    return int(row[0]) if row is not None else 1


def ensure(conn: sqlite3.Connection) -> None:
    """Bring the database to VERSION (idempotent; concurrent processes serialise on the write lock)."""
    path = _db_file(conn)
    if path and path in _done:
        return
    with _lock:
        if version(conn) < VERSION:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if version(conn) < VERSION:  # another process may have done it meanwhile
                    _to_v2(conn)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        if path:
            _done.add(path)


def _columns(conn: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?", (name,)).fetchone() is not None


def _to_v2(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS ctp_schema_versions (name TEXT PRIMARY KEY, version INTEGER NOT NULL)")
    have = _columns(conn, "journal_windows")
    for name, typ in _NEW_WINDOW_COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE journal_windows ADD COLUMN {name} {typ}")
    if _table_exists(conn, "compaction_checkpoints"):
        rows = conn.execute("SELECT * FROM compaction_checkpoints ORDER BY created_at, rowid").fetchall()
        for row in rows:
            _move_checkpoint(conn, row)
        conn.execute("DROP TABLE compaction_checkpoints")
    conn.execute("INSERT INTO ctp_schema_versions(name, version) VALUES (?,?) ON CONFLICT(name) DO UPDATE SET"
                 " version=excluded.version", (NAME, VERSION))


def checkpoint_bootstrap(checkpoint_id: str, marker: str, fallback_text: str, retained: list[Any],
                         fingerprint: dict[str, str] | None, usage: Any) -> dict[str, Any]:
    """The bootstrap of a remote/fallback window, as the compaction store view reads it."""
    return {"checkpoint_id": checkpoint_id, "marker": marker, "fallback_text": fallback_text,
            "retained": retained, "fingerprint": fingerprint, "usage": usage}


def _move_checkpoint(conn: sqlite3.Connection, r: sqlite3.Row) -> None:
    key = r["session_key"]
    fp = None
    if r["provider_kind"] is not None:
        fp = {"provider_kind": r["provider_kind"], "model": r["model"] or "", "endpoint": r["endpoint"] or "",
              "auth_kind": r["auth_kind"] or "none", "account_hash": r["account_hash"] or ""}
    bootstrap = orjson.dumps(checkpoint_bootstrap(
        r["id"], r["marker"], r["fallback_text"], orjson.loads(r["retained_json"]), fp,
        orjson.loads(r["usage_json"]) if r["usage_json"] is not None else None)).decode()
    win = None
    if r["window_id"] is not None:
        win = conn.execute("SELECT * FROM journal_windows WHERE session_key=? AND window_id=?",
                           (key, r["window_id"])).fetchone()
    if win is not None:
        # The journal opened this window at the boundary item's journal id: that id is the one chain's.
        bhash = win["boundary_item_id"] or _one_chain_hash(conn, key, r["boundary"], r["boundary_hash"])
        conn.execute(
            "UPDATE journal_windows SET strategy=?, bootstrap=?, boundary_pos=?, boundary_hash=?, reason=?, opaque=?"
            " WHERE task_id=? AND address=? AND window_id=?",
            (r["strategy"], bootstrap, r["boundary"], bhash, r["reason"], r["compaction_item"], win["task_id"],
             win["address"], win["window_id"]))
        return
    bhash = _one_chain_hash(conn, key, r["boundary"], r["boundary_hash"])
    sess = conn.execute("SELECT task_id, address FROM journal_sessions WHERE session_key=?", (key,)).fetchone()
    if sess is None:  # compaction ran without the journal: the session joins it now, with its windows
        task_id, address = auto_task_id(key), ROOT
        conn.execute("INSERT OR IGNORE INTO journal_tasks(task_id, origin, created_at) VALUES (?,?,?)",
                     (task_id, "session", r["created_at"]))
        conn.execute("INSERT OR IGNORE INTO journal_agents(task_id, address, created_at) VALUES (?,?,?)",
                     (task_id, address, r["created_at"]))
        conn.execute("INSERT OR IGNORE INTO journal_sessions(session_key, task_id, address, source, created_at)"
                     " VALUES (?,?,?,?,?)", (key, task_id, address, "migrated", r["created_at"]))
    else:
        task_id, address = sess["task_id"], sess["address"]
    top = conn.execute("SELECT max(ordinal) FROM journal_windows WHERE task_id=? AND address=?",
                       (task_id, address)).fetchone()
    ordinal = int(top[0] or 0) + 1
    on_branch = None if bhash.startswith(LEGACY_PREFIX) else bhash
    conn.execute(
        "INSERT INTO journal_windows(task_id, address, window_id, ordinal, session_key, boundary_item_id, strategy,"
        " bootstrap, created_at, boundary_pos, boundary_hash, reason, opaque) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (task_id, address, window_id(ordinal), ordinal, key, on_branch, r["strategy"], bootstrap, r["created_at"],
         r["boundary"], bhash, r["reason"], r["compaction_item"]))


def _one_chain_hash(conn: sqlite3.Connection, key: str, boundary: int, old_hash: str) -> str:
    """The boundary's id in the one chain: the journal's item at branch position boundary-1, when the
    journal's first `boundary` branch items hash (old chain) to the checkpoint's stored hash."""
    rows = conn.execute(
        "SELECT b.item_id, r.raw FROM journal_branch b JOIN journal_items i ON i.item_id = b.item_id"
        " JOIN journal_raw r ON r.seq = i.seq WHERE b.session_key=? AND b.pos < ? ORDER BY b.pos",
        (key, boundary)).fetchall()
    if boundary > 0 and len(rows) == boundary:
        items = [orjson.loads(raw) for _, raw in rows]
        if legacy_chain_hash(items, boundary) == LEGACY_PREFIX + old_hash:
            return rows[-1][0]
    return LEGACY_PREFIX + old_hash
