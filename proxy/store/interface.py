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

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

from proxy.journal.model import Window
from proxy.journal.ops import Op, PutWindow
from proxy.journal.query import HistoryReader
from proxy.notes.store import NoteInfo, WriteResult
from proxy.usage import Usage
from proxy.windows.notes.pending import KINDS, Kind, Pending
from proxy.windows.remote.store import Event as CompactionEvent
from proxy.windows.remote.store import SessionRecord

StoreKind = Literal["embedded", "postgresql"]


@runtime_checkable
class NotesBackend(Protocol):
    """The notes of one task. `address` is the owning agent (`/root`, `/root/<name>`); `rel` its path inside the
    agent's notes, checked by `proxy.notes.paths.check_rel` before anything is read or written.

    Contract (both implementations, tests/test_store_interface.py):
    - `read` of a missing note raises NoteError saying so; a read after a successful write sees it;
    - `write` replaces, `append` adds to the end (creating the note); a result over `max_bytes` UTF-8 bytes is
      refused whole with NoteError and the note is as it was; concurrent appends from any process or machine
      are all kept (each is atomic against the others);
    - `created_at` of a note is its first write's time and survives later writes; `updated_at` is the last one's;
    - `iter_files` yields every note of the agent (in no promised order: callers sort), never another agent's."""

    max_bytes: int

    def read(self, address: str, rel: str) -> str: ...

    def iter_files(self, address: str) -> Iterator[NoteInfo]: ...

    def write(self, address: str, rel: str, text: str) -> WriteResult: ...

    def append(self, address: str, rel: str, text: str) -> WriteResult: ...


@runtime_checkable
class RolloverBackend(Protocol):
    """Pending rollovers (`new_context`, a manual checkpoint): one per agent of a task.

    Contract: `mark` is idempotent (an earlier mark keeps its time) and a `checkpoint` mark is never weakened back
    to `new_context`; `take` consumes the mark atomically, so of any number of callers in any processes at most
    one gets it; `take` with `kinds` leaves a mark of another kind alone; `peek` reads without consuming."""

    def mark(self, task_id: str, address: str, kind: Kind = "new_context", origin: str = "tool",
             window_id: str | None = None) -> Pending: ...

    def peek(self, task_id: str, address: str) -> Pending | None: ...

    def take(self, task_id: str, address: str, kinds: tuple[Kind, ...] = KINDS) -> Pending | None: ...


@runtime_checkable
class UsageBackend(Protocol):
    """Token usage per session (proxy/usage.py): the last answer's usage, and before any, an estimate of the request.

    Contract: `record` keeps the newest answer by `at` (when it was seen: a late write never replaces a newer one);
    `record_estimate` replaces the session's estimate; `for_agent` / `estimate_for_agent` answer the agent's newest
    session of the task, never another task's."""

    def record(self, session_key: str, task: str | None, agent: str | None, model: str | None, usage: dict,
               response_id: str | None, at: float | None = None) -> None: ...

    def record_estimate(self, session_key: str, task: str | None, agent: str | None, model: str | None,
                        input_tokens: int, at: float | None = None) -> None: ...

    def for_session(self, session_key: str) -> Usage | None: ...

    def for_agent(self, task: str, agent: str) -> Usage | None: ...

    def estimate_for_agent(self, task: str, agent: str) -> Usage | None: ...


@runtime_checkable
class JournalBackend(Protocol):
    """The journal (proxy/journal/): its writes are the typed ops of proxy/journal/ops.py, applied in one
    transaction per batch by the writer thread; its reads are the journal's (a session, its branch and windows,
    raw and call items, the session of a response id, events) and the history tools' (`history()`).

    Contract (both implementations, tests/test_store_journal.py):
    - `apply` is one transaction; every insert is idempotent (an item id is content-addressed), so a batch
      applied twice, or the same items written by two instances, leave one copy; with a `stamp` (the writer's
      id) each session the batch changed is stamped (ADR 0012), and a branch append merges with what another
      writer put there (the longer of two chains that agree wins);
    - `claim_window` opens a window at once, on its key (task, agent, window id): when another writer holds that
      ordinal the window takes the next free one, and the one returned says which; `create_session` registers a
      session and its first window in one transaction, or returns None when the session exists already;
    - `branch` is the session's current branch in order; `session_for_response` resolves an alias however
      recent, through whichever instance recorded it; `history().search` finds a literal substring
      (case-sensitive) and nothing that only resembles it.
    `shared`: other processes or machines write the same sessions (the journal then checks stamps and opens
    windows with `claim_window`: `claims_windows`). `indexes_text`: the writer brings a text index up to date
    in bulk (`index_text`)."""

    kind: StoreKind
    shared: bool
    claims_windows: bool
    indexes_text: bool

    def open(self) -> None: ...

    def close(self) -> None: ...

    def apply(self, ops: Sequence[Op], stamp: str | None = None) -> int: ...

    def index_text(self) -> int: ...

    def close_writer(self) -> None: ...

    def release_memory(self) -> None:
        """Free what the writer's connection caches (pages, statements) after big work; called on the writer's
        thread while it has nothing pending."""
        ...

    def claim_window(self, op: PutWindow, stamp: str | None = None,
                     renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow: ...

    def create_session(self, ops: Sequence[Op], window: PutWindow, stamp: str | None = None) -> PutWindow | None: ...

    def create_task(self, task_id: str, origin: str, at: float) -> None: ...

    def task_exists(self, task_id: str) -> bool: ...

    def agent_exists(self, task_id: str, address: str) -> bool: ...

    def stamp(self, session_key: str) -> tuple[str, int] | None: ...

    def session(self, session_key: str) -> tuple[str, str, str | None] | None: ...

    def branch(self, session_key: str) -> list[tuple[str, str, str]]: ...

    def latest_window(self, session_key: str) -> Window | None: ...

    def windows(self, session_key: str) -> list[Window]: ...

    def max_ordinal(self, task_id: str, address: str) -> int: ...

    def raw_items(self, item_ids: Sequence[str]) -> list[tuple[str, bytes]]: ...

    def call_items(self, session_key: str, call_ids: Sequence[str],
                   types: Sequence[str]) -> list[tuple[str, bytes]]: ...

    def session_for_response(self, response_id: str) -> str | None: ...

    def sessions_for_responses(self, response_ids: Sequence[str]) -> dict[str, str]:
        """`session_for_response` of several ids in one query: those found (the stateless path's two lookups)."""
        ...

    def response_tail(self, response_id: str) -> str | None: ...

    def events(self, session_key: str) -> list[tuple[str, str, float]]: ...

    def history(self) -> HistoryReader: ...


@runtime_checkable
class CompactionBackend(Protocol):
    """Compaction's own records (proxy/windows/remote/store.py): per session what the last request forwarded, a
    pending forced compaction, a failed remote attempt and the agent items at the last compaction; the
    compaction / recovery / projection events; the effective window an upstream showed per model and endpoint.

    Contract (both implementations, tests/test_store_interface.py):
    - `record_forwarded` replaces the session's last request and clears a forced compaction;
      `mark_force_compact` and `mark_failed` keep what was forwarded; `session_state` is None for a session
      nothing was recorded for, and carries `compacted_items` once `record_compacted` ran (even alone);
    - `events` are oldest first, the newest `limit` of them, per session or over all sessions;
    - `learn_window` keeps the smallest window seen for (model, endpoint)."""

    kind: StoreKind

    def session_state(self, session_key: str) -> SessionRecord | None: ...

    def record_forwarded(self, session_key: str, checkpoint_id: str | None, client_items: int,
                         sent_bytes: int) -> None: ...

    def mark_force_compact(self, session_key: str) -> None: ...

    def mark_failed(self, session_key: str, client_items: int) -> None: ...

    def record_compacted(self, session_key: str, client_items: int) -> None: ...

    def record_event(self, session_key: str, kind: str, outcome: str, reason: str | None = None,
                     checkpoint_id: str | None = None) -> None: ...

    def events(self, session_key: str | None = None, limit: int = 200) -> list[CompactionEvent]: ...

    def learn_window(self, model: str, endpoint: str, window_tokens: int) -> None: ...

    def learned_window(self, model: str, endpoint: str | None = None) -> int | None: ...


@runtime_checkable
class ViewConnection(Protocol):
    """A read-only connection for the views people read (proxy/app/sessionview.py: `ctproxy tasks`, `ctproxy show`,
    the dashboard's API; proxy/app/journal_views.py's report), sqlite3-shaped: `execute(sql, params)` with `?`
    placeholders in the SQL both stores speak, rows by position and by column name; `close` gives it back.
    A PostgreSQL view says so in `dialect = "postgresql"` (sqlite3 has none: SQLite)."""

    def execute(self, sql: str, params: Sequence = ...) -> Any: ...

    def close(self) -> None: ...


@runtime_checkable
class Store(Protocol):
    """One state store: the parts above, opened once per process and closed at its end."""

    kind: StoreKind

    def notes(self, task_id: str) -> NotesBackend:
        """The notes of `task_id` (NotePathError for an invalid task id)."""
        ...

    @property
    def rollovers(self) -> RolloverBackend: ...

    @property
    def usage(self) -> UsageBackend: ...

    def journal(self) -> JournalBackend:
        """The journal's backend (one per store: the process's journal and history readers share it)."""
        ...

    def compaction(self) -> CompactionBackend:
        """Compaction's records (one per store)."""
        ...

    def view(self) -> ViewConnection:
        """A read-only connection on the journal and compaction's records for the views people read (the dashboard
        of any instance, `ctproxy tasks` / `show`): the store's, so every instance on it shows the same state."""
        ...

    def close(self) -> None: ...
