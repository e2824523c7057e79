"""The journal's backend (port.JournalBackend) written once over a SQL database: the writer's batches, the window
claims and session registrations (store.py's one writer), and the journal's reads, each statement in `?`
placeholders and spoken through the store's `Dialect` (dialect.py).

A store's journal (sqlite_backend.SqliteJournal, proxy/store/pg_journal.PgJournal) says only where its connections
come from: `_reading` (one read), `_stamps` (the session stamps, read on the request path), `_writing` (the writer
thread's transaction) and `_claiming` (a transaction of its own, for `claim_window` / `create_session`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import orjson

from proxy.journal import store
from proxy.journal.dialect import Dialect
from proxy.journal.model import Window
from proxy.journal.ops import Op, PutWindow

# (item id, canonical hash, type) of each position of a session's branch
BranchRow = tuple[str, str, str]

# journal_windows' columns in the order of Window's fields
_WINDOW_FIELDS = ("window_id", "ordinal", "session_key", "task_id", "address", "boundary_item_id", "strategy",
                  "bootstrap", "created_at", "boundary_pos", "boundary_hash", "reason", "opaque")
_WINDOW_SELECT = "SELECT " + ", ".join(_WINDOW_FIELDS) + " FROM journal_windows"


def window_from_values(v: Sequence[Any]) -> Window:
    """A Window from journal_windows' columns in `_WINDOW_FIELDS` order."""
    opaque = v[12]
    return Window(v[0], v[1], v[2], v[3], v[4], v[5], v[6], orjson.loads(v[7]), v[8], v[9], v[10], v[11],
                  bytes(opaque) if opaque is not None else None)


def window_from_row(row: Any) -> Window:
    """A Window from a journal_windows row read by column name (`SELECT *` on SQLite)."""
    return window_from_values([row[name] for name in _WINDOW_FIELDS])


class SqlJournal(ABC):
    """The journal on a SQL database: everything but its connections (see the module's docstring)."""

    dialect: Dialect

    # ---- the store's connections ------------------------------------------------------------------------
    @abstractmethod
    def _reading(self) -> AbstractContextManager[Any]: ...

    def _stamps(self) -> AbstractContextManager[Any]:
        return self._reading()

    def _writing(self, locked: set[str]) -> AbstractContextManager[Any]:
        # A store whose writer thread holds its own connection (SQLite) overrides `apply` instead.
        raise TypeError(f"{type(self).__name__} applies ops through its own apply(), not a writing transaction")

    @abstractmethod
    def _claiming(self, locked: set[str]) -> AbstractContextManager[Any]: ...

    def _one(self, sql: str, params: Sequence[Any]) -> Any:
        with self._reading() as conn:
            return conn.execute(self.dialect.sql(sql), params).fetchone()

    def _rows(self, sql: str, params: Sequence[Any]) -> list[Any]:
        with self._reading() as conn:
            return conn.execute(self.dialect.sql(sql), params).fetchall()

    # ---- writes --------------------------------------------------------------------------------------------
    def apply(self, ops: Sequence[Op], stamp: str | None = None) -> int:
        """The ops in one transaction (the session stamps of ADR 0012 with them); items inserted."""
        with self._writing(store.locked_sessions(ops)) as conn:
            return store.apply_ops(conn, self.dialect, ops, stamp)

    def claim_window(self, op: PutWindow, stamp: str | None = None,
                     renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow:
        """Open the window now, in a transaction of its own: on its key, and when another writer holds that
        ordinal, the next one (made again by `renamed`, when given). The window as opened."""
        with self._claiming({op.session_key}) as conn:
            return store.claim(conn, self.dialect, op, stamp, renamed)

    def create_session(self, ops: Sequence[Op], window: PutWindow, stamp: str | None = None) -> PutWindow | None:
        """Register a session (its task and agent ops, then its EnsureSession last) with its first window, in
        one transaction; None when the session existed already (another writer registered it: load it)."""
        with self._claiming({window.session_key}) as conn:
            return store.register(conn, self.dialect, ops, window, stamp)

    def create_task(self, task_id: str, origin: str, at: float) -> None:
        with self._reading() as conn:
            conn.execute(self.dialect.sql("INSERT INTO journal_tasks(task_id, origin, created_at) VALUES (?,?,?)"),
                         (task_id, origin, at))

    # ---- reads -----------------------------------------------------------------------------------------------
    def task_exists(self, task_id: str) -> bool:
        return self._one("SELECT 1 FROM journal_tasks WHERE task_id=?", (task_id,)) is not None

    def agent_exists(self, task_id: str, address: str) -> bool:
        return self._one("SELECT 1 FROM journal_agents WHERE task_id=? AND address=?", (task_id, address)) is not None

    def stamp(self, session_key: str) -> tuple[str, int] | None:
        with self._stamps() as conn:
            row = conn.execute(self.dialect.sql("SELECT writer, n FROM journal_session_stamps WHERE session_key=?"),
                               (session_key,)).fetchone()
        return (row[0], int(row[1])) if row is not None else None

    def session(self, session_key: str) -> tuple[str, str, str | None] | None:
        """(task id, address, source) of a session."""
        row = self._one("SELECT task_id, address, source FROM journal_sessions WHERE session_key=?", (session_key,))
        return (row[0], row[1], row[2]) if row is not None else None

    def branch(self, session_key: str) -> list[BranchRow]:
        return [(r[0], r[1], r[2]) for r in self._rows(
            "SELECT i.item_id, i.canon_hash, i.type FROM journal_branch b JOIN journal_items i"
            " ON i.item_id = b.item_id WHERE b.session_key=? ORDER BY b.pos", (session_key,))]

    def latest_window(self, session_key: str) -> Window | None:
        row = self._one(f"{_WINDOW_SELECT} WHERE session_key=? ORDER BY ordinal DESC LIMIT 1", (session_key,))
        return window_from_values(row) if row is not None else None

    def windows(self, session_key: str) -> list[Window]:
        return [window_from_values(r) for r in self._rows(f"{_WINDOW_SELECT} WHERE session_key=? ORDER BY ordinal",
                                                          (session_key,))]

    def max_ordinal(self, task_id: str, address: str) -> int:
        row = self._one("SELECT max(ordinal) FROM journal_windows WHERE task_id=? AND address=?", (task_id, address))
        return int(row[0] or 0)

    def raw_items(self, item_ids: Sequence[str]) -> list[tuple[str, bytes]]:
        cond, params = self.dialect.any_of("i.item_id", item_ids)
        return [(r[0], bytes(r[1])) for r in self._rows(
            f"SELECT i.item_id, r.raw FROM journal_items i JOIN journal_raw r ON r.seq = i.seq WHERE {cond}", params)]

    def call_items(self, session_key: str, call_ids: Sequence[str], types: Sequence[str]) -> list[tuple[str, bytes]]:
        """(call id, raw) of the session's items of these types with these call ids, in journal order."""
        calls, call_params = self.dialect.any_of("i.call_id", call_ids)
        typed, type_params = self.dialect.any_of("i.type", types)
        return [(r[0], bytes(r[1])) for r in self._rows(
            "SELECT i.call_id, r.raw FROM journal_items i JOIN journal_raw r ON r.seq = i.seq"
            f" WHERE i.session_key=? AND {calls} AND {typed} ORDER BY i.seq",
            (session_key, *call_params, *type_params))]

    def session_for_response(self, response_id: str) -> str | None:
        row = self._one("SELECT session_key FROM journal_aliases WHERE response_id=?", (response_id,))
        return row[0] if row is not None else None

    def sessions_for_responses(self, response_ids: Sequence[str]) -> dict[str, str]:
        if not response_ids:
            return {}
        cond, params = self.dialect.any_of("response_id", response_ids)
        return {r[0]: r[1] for r in self._rows(f"SELECT response_id, session_key FROM journal_aliases WHERE {cond}",
                                               params)}

    def response_tail(self, response_id: str) -> str | None:
        row = self._one("SELECT tail_item_id FROM journal_responses WHERE response_id=?", (response_id,))
        return row[0] if row is not None else None

    def events(self, session_key: str) -> list[tuple[str, str, float]]:
        """(kind, detail JSON, created_at) of the session's events, oldest first."""
        return [(r[0], r[1], float(r[2])) for r in self._rows(
            "SELECT kind, detail, created_at FROM journal_events WHERE session_key=? ORDER BY id", (session_key,))]
