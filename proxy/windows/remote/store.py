"""What compaction keeps in the shared SQLite database, and its view of its windows.

A compaction checkpoint (seed 004 §5.2) is a journal window with strategy `remote` or `fallback`
(ADR 0006): the window row holds the boundary, the readable side (marker + transcript excerpt), the
opaque compaction item byte for byte, the retained user messages, the fingerprint and the usage.
`Checkpoint` is a typed view of such a window; it is written through the journal
(`Journal.start_window`). Kept here per session: what was forwarded last (for the estimate), a pending
forced compaction, the item count at the last compaction, the compaction/recovery events (for
`ctproxy tasks`, next to the journal's own records), and the effective context size an upstream showed.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.db import register_schema
from proxy.items.canonical import session_root
from proxy.journal import COMPACTION_STRATEGIES, Strategy, Window, migrate
from proxy.journal.journal import window_from_row
from proxy.journal.migrate import checkpoint_bootstrap
from proxy.windows.remote.bootstraps import CompactionRecord
from proxy.windows.remote.decision import LastRequest
from proxy.windows.remote.fingerprint import Fingerprint

SCHEMA = """
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
    """
register_schema("compaction", SCHEMA)

# In a window's bootstrap JSON: the agent's instructions the window keeps whole, and the boundary's chain over the
# conversation without them (proxy/windows/apply.py); a notes window stores the count beside its items.
LEADING_KEY = "leading"
LEAD_KEY = "lead"
CONVERSATION_KEY = "conversation_hash"


@dataclass(frozen=True)
class Checkpoint:
    """A remote/fallback window, typed (see `from_window`)."""

    id: str  # the checkpoint id (cp_…): named by its marker and its events
    session_key: str  # the journal session whose window it is
    created_at: float
    strategy: Strategy  # remote | fallback (COMPACTION_STRATEGIES)
    reason: str
    boundary: int
    boundary_hash: str  # one-chain id of the boundary item (proxy.items.canonical.chain_at)
    marker: str
    fallback_text: str
    compaction_item: bytes | None
    retained: tuple[dict[str, Any], ...]
    fingerprint: Fingerprint | None
    usage: dict[str, Any] | None
    window_id: str | None = None
    boundary_item_id: str | None = None  # the journal's id of the boundary item, when it is on the branch
    preface: tuple[dict[str, Any], ...] = ()  # the window's notes parts (CompactionRecord)
    coda: tuple[dict[str, Any], ...] = ()
    leading: tuple[dict[str, Any], ...] = ()  # the agent's instructions, kept whole (CompactionRecord)
    conversation_hash: str = ""  # the boundary's chain over the conversation alone

    @property
    def root(self) -> str:
        """Where the boundary's chain starts: the journal session's root."""
        return session_root(self.session_key)

    def record(self) -> CompactionRecord:
        item = orjson.loads(self.compaction_item) if self.compaction_item is not None else None
        return CompactionRecord(self.id, self.boundary, self.boundary_hash, self.retained, item, self.fallback_text,
                                self.root, self.preface, self.coda, self.leading, self.conversation_hash)

    def bootstrap(self) -> dict[str, Any]:
        """What the window row's `bootstrap` holds (the opaque item is its own column)."""
        fp = self.fingerprint
        out = checkpoint_bootstrap(self.id, self.marker, self.fallback_text, list(self.retained),
                                   dataclasses.asdict(fp) if fp is not None else None, self.usage)
        if self.leading:
            out.update({LEADING_KEY: list(self.leading), CONVERSATION_KEY: self.conversation_hash})
        return out

    @staticmethod
    def from_window(w: Window) -> Checkpoint | None:
        """The checkpoint a window is, or None for a window of another strategy."""
        if w.strategy not in COMPACTION_STRATEGIES or w.boundary_pos is None:
            return None
        b = w.bootstrap
        fp = b.get("fingerprint")
        return Checkpoint(
            id=str(b.get("checkpoint_id") or w.window_id), session_key=w.session_key, created_at=w.created_at,
            strategy=w.strategy, reason=w.reason or "", boundary=w.boundary_pos, boundary_hash=w.boundary_hash or "",
            marker=str(b.get("marker") or ""), fallback_text=str(b.get("fallback_text") or ""),
            compaction_item=w.opaque, retained=tuple(b.get("retained") or ()),
            fingerprint=Fingerprint(**fp) if isinstance(fp, dict) else None, usage=b.get("usage"),
            window_id=w.window_id, boundary_item_id=w.boundary_item_id,
            preface=tuple(b.get("preface") or ()), coda=tuple(b.get("coda") or ()),
            leading=tuple(b.get(LEADING_KEY) or ()), conversation_hash=str(b.get(CONVERSATION_KEY) or ""))


def new_checkpoint_id() -> str:
    return "cp_" + uuid.uuid4().hex[:20]


def _windows(conn: sqlite3.Connection, session_key: str, newest_only: bool) -> list[Window]:
    migrate.ensure(conn)
    sql = "SELECT * FROM journal_windows WHERE session_key=? ORDER BY ordinal"
    sql += " DESC LIMIT 1" if newest_only else ""
    return [window_from_row(r) for r in conn.execute(sql, (session_key,)).fetchall()]


def latest_checkpoint(conn: sqlite3.Connection, session_key: str) -> Checkpoint | None:
    """The checkpoint in effect: the session's current window, when it is one (a newer window of another
    strategy supersedes it)."""
    found = _windows(conn, session_key, True)
    return Checkpoint.from_window(found[0]) if found else None


def checkpoints(conn: sqlite3.Connection, session_key: str) -> list[Checkpoint]:
    """Every checkpoint of a session, oldest first (committed windows only)."""
    return [cp for w in _windows(conn, session_key, False) if (cp := Checkpoint.from_window(w)) is not None]


def sessions_with_checkpoints(conn: sqlite3.Connection) -> list[str]:
    migrate.ensure(conn)
    return [r[0] for r in conn.execute(
        "SELECT DISTINCT session_key FROM journal_windows WHERE strategy IN ('remote', 'fallback') ORDER BY 1")]


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


def learned_window(conn: sqlite3.Connection, model: str, endpoint: str | None = None) -> int | None:
    """The window learned for (model, endpoint); without an endpoint (a reader that does not know it: the
    tool server, `ctproxy show`), the smallest learned for the model anywhere."""
    if endpoint is None:
        row = conn.execute("SELECT min(window_tokens) FROM compaction_windows WHERE model=?", (model,)).fetchone()
    else:
        row = conn.execute("SELECT window_tokens FROM compaction_windows WHERE model=? AND endpoint=?",
                           (model, endpoint)).fetchone()
    return int(row[0]) if row is not None and row[0] is not None else None


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


class SqliteCompaction:
    """The embedded store's `CompactionBackend` (proxy/store/interface.py): the statements above on a SQLite
    connection. The proxy binds one to its database thread's connection for each write or read (`on(conn)`), so
    its writes stay in that thread's batched transaction as before; the embedded store gives it its per-thread
    connections (`EmbeddedStore.compaction()`)."""

    kind = "embedded"

    def __init__(self, conn: Callable[[], sqlite3.Connection]):
        self._conn = conn

    @staticmethod
    def on(conn: sqlite3.Connection) -> SqliteCompaction:
        return SqliteCompaction(lambda: conn)

    def session_state(self, session_key: str) -> SessionRecord | None:
        return session_state(self._conn(), session_key)

    def record_forwarded(self, session_key: str, checkpoint_id: str | None, client_items: int,
                         sent_bytes: int) -> None:
        record_forwarded(self._conn(), session_key, checkpoint_id, client_items, sent_bytes)

    def mark_force_compact(self, session_key: str) -> None:
        mark_force_compact(self._conn(), session_key)

    def mark_failed(self, session_key: str, client_items: int) -> None:
        mark_failed(self._conn(), session_key, client_items)

    def record_compacted(self, session_key: str, client_items: int) -> None:
        record_compacted(self._conn(), session_key, client_items)

    def record_event(self, session_key: str, kind: str, outcome: str, reason: str | None = None,
                     checkpoint_id: str | None = None) -> None:
        record_event(self._conn(), session_key, kind, outcome, reason, checkpoint_id)

    def events(self, session_key: str | None = None, limit: int = 200) -> list[Event]:
        return events(self._conn(), session_key, limit)

    def learn_window(self, model: str, endpoint: str, window_tokens: int) -> None:
        learn_window(self._conn(), model, endpoint, window_tokens)

    def learned_window(self, model: str, endpoint: str | None = None) -> int | None:
        return learned_window(self._conn(), model, endpoint)


class SessionMemo:
    """This process's last known session state per session, kept in step with what the compaction addon
    itself writes; any other write forgets the session, and the next request reads the database again.
    (The checkpoint in effect is the journal's current window, cached by the journal.) Bounded. In a worker of
    `ctproxy up --workers N` another process may write the session too, so there it remembers nothing and every
    request reads the database (`shared`, proxy/workerid.py; ADR 0012)."""

    def __init__(self, capacity: int = 10_000, shared: bool | None = None):
        from collections import OrderedDict

        from proxy import workerid

        self._items: OrderedDict[str, SessionRecord] = OrderedDict()
        self._capacity = capacity
        self.shared = workerid.shared_sessions() if shared is None else shared

    def get(self, key: str) -> SessionRecord | None:
        return None if self.shared else self._items.get(key)

    def put(self, key: str, state: SessionRecord) -> None:
        self._items[key] = state
        self._items.move_to_end(key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def forget(self, key: str) -> None:
        self._items.pop(key, None)
