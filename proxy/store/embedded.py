"""The embedded store behind the store interface (proxy/store/interface.py): the state directory's SQLite database
(WAL mode) and its note files, exactly as ctproxy has always kept them.

Notes are `proxy.notes.store.NotesStore` (real files under a cross-process file lock); pending rollovers are the
`context_rollovers` table through `proxy.context.rollover`'s functions, on one connection per thread (SQLite
connections are cheap, and a thread that holds its own never waits for another's statement). A mark also moves
the rollover stamp file, so a proxy process that trusts its "nothing pending" sees it at once.
"""

from __future__ import annotations

import sqlite3
import threading

from proxy.context import rollover
from proxy.context.rollover import KINDS, Kind, Pending
from proxy.db import connect
from proxy.notes.store import NotesStore
from proxy.state import StateDir
from proxy.store.interface import StoreKind


class EmbeddedRollovers:
    def __init__(self, state: StateDir):
        self._path = state.db_path
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self._path)
            rollover.ensure(conn)  # (a connection opened before the module registered its schema)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def mark(self, task_id: str, address: str, kind: Kind = "new_context", origin: str = "tool",
             window_id: str | None = None) -> Pending:
        return rollover.mark_pending(self._conn(), task_id, address, kind, origin, window_id)

    def peek(self, task_id: str, address: str) -> Pending | None:
        return rollover.peek_pending(self._conn(), task_id, address)

    def take(self, task_id: str, address: str, kinds: tuple[Kind, ...] = KINDS) -> Pending | None:
        return rollover.take_pending(self._conn(), task_id, address, kinds)

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            conn.close()
        self._local = threading.local()


class EmbeddedStore:
    """The state directory's store: the default, and the one every `ctproxy up` without `--store` runs on."""

    kind: StoreKind = "embedded"

    def __init__(self, state: StateDir):
        self.state = state
        self._rollovers = EmbeddedRollovers(state)

    def notes(self, task_id: str) -> NotesStore:
        return NotesStore(self.state.subdir("notes"), task_id)

    @property
    def rollovers(self) -> EmbeddedRollovers:
        return self._rollovers

    def close(self) -> None:
        self._rollovers.close()
