"""The one store interface (issue 32, ADR 0013): what ctproxy's state parts call, whichever store holds them.

Two implementations sit behind it: the embedded store (SQLite in WAL mode plus note files in the state directory,
proxy/store/embedded.py, the default) and PostgreSQL (proxy/store/pg.py), which several `ctproxy up` on one
machine or several share. The interface is synchronous: the state is used from threads (the journal's writer,
the proxy's database thread, the tool server's executors, the CLI) as much as from event loops, which reach it
through their own thread hop, as they reach SQLite today.

Served through it: notes, pending rollovers, usage, the journal (tasks, agents, sessions, windows, items,
branches, events, responses and response-id aliases, with the history tools' reader) and compaction's records
(per session: what went up last, a forced compaction, the items at the last compaction; compaction and recovery
events; the windows learned from upstreams), and the read-only view the dashboard, `ctproxy tasks` and `ctproxy
show` read (`view()`).

Errors are the embedded store's, word for word, whichever implementation raises them: `NoteError` for what the
model got wrong about a note (it sees the message), `NotePathError` for a bad path or task id.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

# The ports live with the rooms that own them (ADR 0014); the store's adapters implement them, and the app and the
# tool server, which hold a whole store, read them here.
from proxy.journal.port import JournalBackend
from proxy.notes.port import NotesBackend
from proxy.state import StoreKind
from proxy.usage import UsageBackend
from proxy.windows.notes.port import RolloverBackend
from proxy.windows.ports import WindowStore
from proxy.windows.remote.port import CompactionBackend

__all__ = ["CompactionBackend", "JournalBackend", "NotesBackend", "RolloverBackend", "Store", "StoreKind",
           "UsageBackend", "ViewConnection", "WindowStore"]


@runtime_checkable
class ViewConnection(Protocol):
    """A read-only connection for the views people read (proxy/app/sessionview.py: `ctproxy tasks`, `ctproxy show`,
    the dashboard's API; proxy/app/journal_views.py's report), sqlite3-shaped: `execute(sql, params)` with `?`
    placeholders in the SQL both stores speak, rows by position and by column name; `close` gives it back.
    A PostgreSQL view says so in `dialect = "postgresql"` (sqlite3 has none: SQLite)."""

    def execute(self, sql: str, params: Sequence = ...) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class Store(WindowStore, Protocol):
    """One state store: the parts the window feature reads (`WindowStore`: notes, rollovers, usage, the journal,
    compaction's records), and the views people read; opened once per process and closed at its end."""

    def view(self) -> ViewConnection:
        """A read-only connection on the journal and compaction's records for the views people read (the dashboard
        of any instance, `ctproxy tasks` / `show`): the store's, so every instance on it shows the same state."""
        ...

    def close(self) -> None: ...
