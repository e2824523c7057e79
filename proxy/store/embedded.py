"""The embedded store behind the store interface (proxy/store/interface.py): the state directory's SQLite database
(WAL mode) and its note files, exactly as ctproxy has always kept them.

Notes are `proxy.notes.store.NotesStore` (real files under a cross-process file lock); pending rollovers are the
`context_rollovers` table through `proxy.windows.notes.rollover`'s functions, usage the `usage` / `usage_estimates`
tables through `proxy.usage`'s and compaction's records its tables through `proxy.windows.remote.store`'s, on one
connection per thread (SQLite connections are cheap, and a thread that holds its own never waits for another's
statement). A mark also moves the rollover stamp file, so a proxy process that trusts its "nothing pending" sees
it at once.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from proxy import usage as usage_sql
from proxy.db import connect
from proxy.journal.sqlite_backend import SqliteJournal
from proxy.notes.store import NotesStore
from proxy.state import StateDir
from proxy.store.interface import StoreKind
from proxy.usage import Usage
from proxy.windows.notes import rollover
from proxy.windows.notes.pending import KINDS, Kind, Pending
from proxy.windows.remote import store as compaction_sql


class _Connections:
    """One SQLite connection per thread on the state's database, all closed by `close`."""

    def __init__(self, path: Path):
        self._path = path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self._path)
            rollover.ensure(conn)  # (a connection opened before the modules registered their schemas)
            conn.executescript(compaction_sql.SCHEMA)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()


class EmbeddedRollovers:
    def __init__(self, conns: _Connections):
        self._conns = conns

    def mark(self, task_id: str, address: str, kind: Kind = "new_context", origin: str = "tool",
             window_id: str | None = None) -> Pending:
        return rollover.mark_pending(self._conns.get(), task_id, address, kind, origin, window_id)

    def peek(self, task_id: str, address: str) -> Pending | None:
        return rollover.peek_pending(self._conns.get(), task_id, address)

    def take(self, task_id: str, address: str, kinds: tuple[Kind, ...] = KINDS) -> Pending | None:
        return rollover.take_pending(self._conns.get(), task_id, address, kinds)


class EmbeddedUsage:
    def __init__(self, conns: _Connections):
        self._conns = conns

    def record(self, session_key: str, task: str | None, agent: str | None, model: str | None, usage: dict,
               response_id: str | None, at: float | None = None) -> None:
        usage_sql.record_usage(self._conns.get(), session_key, task, agent, model, usage, response_id, at)

    def record_estimate(self, session_key: str, task: str | None, agent: str | None, model: str | None,
                        input_tokens: int, at: float | None = None) -> None:
        usage_sql.record_estimate(self._conns.get(), session_key, task, agent, model, input_tokens, at)

    def for_session(self, session_key: str) -> Usage | None:
        return usage_sql.last_usage_for_session(self._conns.get(), session_key)

    def for_agent(self, task: str, agent: str) -> Usage | None:
        return usage_sql.last_usage_for_agent(self._conns.get(), task, agent)

    def estimate_for_agent(self, task: str, agent: str) -> Usage | None:
        return usage_sql.estimate_for_agent(self._conns.get(), task, agent)


class EmbeddedStore:
    """The state directory's store: the default, and the one every `ctproxy up` without `--store` runs on."""

    kind: StoreKind = "embedded"

    def __init__(self, state: StateDir):
        self.state = state
        self._conns = _Connections(state.db_path)
        self._rollovers = EmbeddedRollovers(self._conns)
        self._usage = EmbeddedUsage(self._conns)
        self._compaction = compaction_sql.SqliteCompaction(self._conns.get)
        self._journal: SqliteJournal | None = None
        self._journal_lock = threading.Lock()

    def notes(self, task_id: str) -> NotesStore:
        return NotesStore(self.state.subdir("notes"), task_id)

    @property
    def rollovers(self) -> EmbeddedRollovers:
        return self._rollovers

    @property
    def usage(self) -> EmbeddedUsage:
        return self._usage

    def journal(self) -> SqliteJournal:
        """The journal in the state's database, the statements it has always run (connections opened on use)."""
        with self._journal_lock:
            if self._journal is None:
                self._journal = SqliteJournal(self.state.db_path)
            return self._journal

    def compaction(self) -> compaction_sql.SqliteCompaction:
        """Compaction's records in the state's database (the proxy's own writes bind the same statements to its
        database thread's connection: `SqliteCompaction.on`)."""
        return self._compaction

    def view(self) -> sqlite3.Connection:
        """A connection on the state's database for the views people read (closed by the caller)."""
        return connect(self.state.db_path)

    def close(self) -> None:
        self._conns.close()
        with self._journal_lock:
            if self._journal is not None:
                self._journal.close()
