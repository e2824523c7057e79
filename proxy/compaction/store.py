"""The dual representation of a compaction checkpoint (seed 004 §5.2), in the shared SQLite database.

A checkpoint holds the readable side (unique marker + transcript excerpt) and, separately, the
opaque compaction item byte for byte, the retained user messages, the fingerprint and the usage.
Also per session: what was forwarded last (for the estimate) and the compaction/recovery events
(for `ctproxy tasks`, next to the journal's own records).
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.compaction.decision import LastRequest
from proxy.compaction.fingerprint import Fingerprint
from proxy.db import register_schema
from proxy.transforms.compaction import CompactionRecord

register_schema(
    "compaction",
    """
    CREATE TABLE IF NOT EXISTS compaction_checkpoints (
        id TEXT PRIMARY KEY,
        session_key TEXT NOT NULL,
        created_at REAL NOT NULL,
        strategy TEXT NOT NULL,            -- remote | fallback
        reason TEXT NOT NULL,              -- threshold | overflow; a fallback also names its failure
        boundary INTEGER NOT NULL,         -- client items covered
        boundary_hash TEXT NOT NULL,       -- hash chain of those items
        marker TEXT NOT NULL,
        fallback_text TEXT NOT NULL,       -- marker + excerpt (<= 12,000 chars of excerpt)
        compaction_item BLOB,              -- the opaque item as received; NULL for fallback-only
        retained_json BLOB NOT NULL,       -- retained real user messages, JSON array
        provider_kind TEXT, model TEXT, endpoint TEXT, auth_kind TEXT, account_hash TEXT,
        usage_json BLOB,
        window_id TEXT
    );
    CREATE INDEX IF NOT EXISTS compaction_checkpoints_by_session
        ON compaction_checkpoints(session_key, created_at);
    CREATE TABLE IF NOT EXISTS compaction_sessions (
        session_key TEXT PRIMARY KEY,
        checkpoint_id TEXT,
        client_items INTEGER NOT NULL,
        sent_bytes INTEGER NOT NULL,
        force_compact INTEGER NOT NULL DEFAULT 0,  -- an overflow passed unrecovered: compact next time
        failed_items INTEGER,                      -- client items when the last remote attempt failed
        updated_at REAL NOT NULL
    );
    CREATE TABLE IF NOT EXISTS compaction_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        session_key TEXT NOT NULL,
        at REAL NOT NULL,
        kind TEXT NOT NULL,                -- compaction | recovery | projection
        outcome TEXT NOT NULL,             -- remote | fallback | recovered | failed | diverged | ...
        reason TEXT,                       -- a category, never content
        checkpoint_id TEXT
    );
    CREATE INDEX IF NOT EXISTS compaction_events_by_session ON compaction_events(session_key, at);
    -- Client items when the session last compacted: no second compaction without new agent items.
    CREATE TABLE IF NOT EXISTS compaction_progress (
        session_key TEXT PRIMARY KEY,
        compacted_items INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    -- The effective window an upstream showed (it answered context_length_exceeded at this size, in
    -- estimated tokens), per model and normalised endpoint, when it is below the model table's.
    CREATE TABLE IF NOT EXISTS compaction_windows (
        model TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        window_tokens INTEGER NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (model, endpoint)
    );
    """,
)


@dataclass(frozen=True)
class Checkpoint:
    id: str
    session_key: str
    created_at: float
    strategy: str
    reason: str
    boundary: int
    boundary_hash: str
    marker: str
    fallback_text: str
    compaction_item: bytes | None
    retained: tuple[dict[str, Any], ...]
    fingerprint: Fingerprint | None
    usage: dict[str, Any] | None
    window_id: str | None = None

    def record(self) -> CompactionRecord:
        item = orjson.loads(self.compaction_item) if self.compaction_item is not None else None
        return CompactionRecord(self.id, self.boundary, self.boundary_hash, self.retained, item, self.fallback_text)


def new_checkpoint_id() -> str:
    return "cp_" + uuid.uuid4().hex[:20]


def save_checkpoint(conn: sqlite3.Connection, cp: Checkpoint) -> None:
    fp = cp.fingerprint
    conn.execute(
        "INSERT INTO compaction_checkpoints(id, session_key, created_at, strategy, reason, boundary, boundary_hash,"
        " marker, fallback_text, compaction_item, retained_json, provider_kind, model, endpoint, auth_kind,"
        " account_hash, usage_json, window_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
        (cp.id, cp.session_key, cp.created_at, cp.strategy, cp.reason, cp.boundary, cp.boundary_hash, cp.marker,
         cp.fallback_text, cp.compaction_item, orjson.dumps(list(cp.retained)),
         fp.provider_kind if fp else None, fp.model if fp else None, fp.endpoint if fp else None,
         fp.auth_kind if fp else None, fp.account_hash if fp else None,
         orjson.dumps(cp.usage) if cp.usage is not None else None, cp.window_id),
    )


def _checkpoint(row: sqlite3.Row) -> Checkpoint:
    fp = None
    if row["provider_kind"] is not None:
        fp = Fingerprint(row["provider_kind"], row["model"] or "", row["endpoint"] or "", row["auth_kind"] or "none",
                         row["account_hash"] or "")
    return Checkpoint(
        id=row["id"], session_key=row["session_key"], created_at=row["created_at"], strategy=row["strategy"],
        reason=row["reason"], boundary=row["boundary"], boundary_hash=row["boundary_hash"], marker=row["marker"],
        fallback_text=row["fallback_text"],
        compaction_item=bytes(row["compaction_item"]) if row["compaction_item"] is not None else None,
        retained=tuple(orjson.loads(row["retained_json"])), fingerprint=fp,
        usage=orjson.loads(row["usage_json"]) if row["usage_json"] is not None else None,
        window_id=row["window_id"],
    )


def latest_checkpoint(conn: sqlite3.Connection, session_key: str) -> Checkpoint | None:
    row = conn.execute(
        "SELECT * FROM compaction_checkpoints WHERE session_key=? ORDER BY created_at DESC, rowid DESC LIMIT 1",
        (session_key,),
    ).fetchone()
    return _checkpoint(row) if row is not None else None


def checkpoints(conn: sqlite3.Connection, session_key: str) -> list[Checkpoint]:
    rows = conn.execute(
        "SELECT * FROM compaction_checkpoints WHERE session_key=? ORDER BY created_at, rowid", (session_key,)
    ).fetchall()
    return [_checkpoint(r) for r in rows]


def set_window_id(conn: sqlite3.Connection, checkpoint_id: str, window_id: str) -> None:
    conn.execute("UPDATE compaction_checkpoints SET window_id=? WHERE id=?", (window_id, checkpoint_id))


@dataclass(frozen=True)
class SessionRecord:
    """What compaction keeps per session (table compaction_sessions); not the journal's SessionState."""

    last: LastRequest
    force_compact: bool
    failed_items: int | None
    compacted_items: int | None = None  # client items at the session's last compaction


def session_state(conn: sqlite3.Connection, session_key: str) -> SessionRecord | None:
    row = conn.execute("SELECT * FROM compaction_sessions WHERE session_key=?", (session_key,)).fetchone()
    done = compacted_items(conn, session_key)
    if row is None:
        return None if done is None else SessionRecord(LastRequest(None, 0, 0), False, None, done)
    return SessionRecord(LastRequest(row["checkpoint_id"], row["client_items"], row["sent_bytes"]),
                        bool(row["force_compact"]), row["failed_items"], done)


def record_compacted(conn: sqlite3.Connection, session_key: str, client_items: int) -> None:
    conn.execute(
        "INSERT INTO compaction_progress(session_key, compacted_items, updated_at) VALUES (?,?,?)"
        " ON CONFLICT(session_key) DO UPDATE SET compacted_items=excluded.compacted_items,"
        " updated_at=excluded.updated_at",
        (session_key, client_items, time.time()),
    )


def compacted_items(conn: sqlite3.Connection, session_key: str) -> int | None:
    row = conn.execute("SELECT compacted_items FROM compaction_progress WHERE session_key=?",
                       (session_key,)).fetchone()
    return int(row[0]) if row is not None else None


def learn_window(conn: sqlite3.Connection, model: str, endpoint: str, window_tokens: int) -> None:
    """Remember that the upstream overflowed at `window_tokens` (kept: the smallest seen)."""
    conn.execute(
        "INSERT INTO compaction_windows(model, endpoint, window_tokens, updated_at) VALUES (?,?,?,?)"
        " ON CONFLICT(model, endpoint) DO UPDATE SET window_tokens=min(window_tokens, excluded.window_tokens),"
        " updated_at=excluded.updated_at",
        (model, endpoint, window_tokens, time.time()),
    )


def learned_window(conn: sqlite3.Connection, model: str, endpoint: str) -> int | None:
    row = conn.execute("SELECT window_tokens FROM compaction_windows WHERE model=? AND endpoint=?",
                       (model, endpoint)).fetchone()
    return int(row[0]) if row is not None else None


def record_forwarded(conn: sqlite3.Connection, session_key: str, checkpoint_id: str | None, client_items: int,
                     sent_bytes: int) -> None:
    """What this request forwarded; clears a pending forced compaction."""
    conn.execute(
        "INSERT INTO compaction_sessions(session_key, checkpoint_id, client_items, sent_bytes, force_compact,"
        " updated_at) VALUES (?,?,?,?,0,?) ON CONFLICT(session_key) DO UPDATE SET"
        " checkpoint_id=excluded.checkpoint_id, client_items=excluded.client_items, sent_bytes=excluded.sent_bytes,"
        " force_compact=0, updated_at=excluded.updated_at",
        (session_key, checkpoint_id, client_items, sent_bytes, time.time()),
    )


def mark_force_compact(conn: sqlite3.Connection, session_key: str) -> None:
    conn.execute(
        "INSERT INTO compaction_sessions(session_key, checkpoint_id, client_items, sent_bytes, force_compact,"
        " updated_at) VALUES (?,NULL,0,0,1,?) ON CONFLICT(session_key) DO UPDATE SET force_compact=1,"
        " updated_at=excluded.updated_at",
        (session_key, time.time()),
    )


def mark_failed(conn: sqlite3.Connection, session_key: str, client_items: int) -> None:
    conn.execute(
        "INSERT INTO compaction_sessions(session_key, checkpoint_id, client_items, sent_bytes, failed_items,"
        " updated_at) VALUES (?,NULL,0,0,?,?) ON CONFLICT(session_key) DO UPDATE SET"
        " failed_items=excluded.failed_items, updated_at=excluded.updated_at",
        (session_key, client_items, time.time()),
    )


def record_event(conn: sqlite3.Connection, session_key: str, kind: str, outcome: str, reason: str | None = None,
                 checkpoint_id: str | None = None) -> None:
    conn.execute(
        "INSERT INTO compaction_events(session_key, at, kind, outcome, reason, checkpoint_id) VALUES (?,?,?,?,?,?)",
        (session_key, time.time(), kind, outcome, reason, checkpoint_id),
    )


@dataclass(frozen=True)
class Event:
    session_key: str
    at: float
    kind: str
    outcome: str
    reason: str | None
    checkpoint_id: str | None


def events(conn: sqlite3.Connection, session_key: str | None = None, limit: int = 200) -> list[Event]:
    """Compactions and recoveries, newest last (for `ctproxy tasks`)."""
    if session_key is None:
        rows = conn.execute("SELECT * FROM compaction_events ORDER BY id DESC LIMIT ?", (limit,)).fetchall()
    else:
        rows = conn.execute("SELECT * FROM compaction_events WHERE session_key=? ORDER BY id DESC LIMIT ?",
                            (session_key, limit)).fetchall()
    return [Event(r["session_key"], r["at"], r["kind"], r["outcome"], r["reason"], r["checkpoint_id"])
            for r in reversed(rows)]


class SessionMemo:
    """This process's last known (checkpoint, session state) per session, kept in step with what the
    compaction addon itself writes; any other write forgets the session, and the next request reads
    the database again. Bounded; a session served by two proxy processes at once is not supported."""

    def __init__(self, capacity: int = 10_000):
        from collections import OrderedDict

        self._items: OrderedDict[str, tuple[Checkpoint | None, SessionRecord]] = OrderedDict()
        self._capacity = capacity

    def get(self, key: str) -> tuple[Checkpoint | None, SessionRecord] | None:
        return self._items.get(key)

    def put(self, key: str, checkpoint: Checkpoint | None, state: SessionRecord) -> None:
        self._items[key] = (checkpoint, state)
        self._items.move_to_end(key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def forget(self, key: str) -> None:
        self._items.pop(key, None)
