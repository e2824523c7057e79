"""The one store interface (issue 32, ADR 0013): what ctproxy's state parts call, whichever store holds them.

Two implementations sit behind it: the embedded store (SQLite in WAL mode plus note files in the state directory,
proxy/store/embedded.py, the default) and PostgreSQL (proxy/store/pg.py), which several `ctproxy up` on one
machine or several share. The interface is synchronous: the state is used from threads (the journal's writer,
the proxy's database thread, the tool server's executors, the CLI) as much as from event loops, which reach it
through their own thread hop, as they reach SQLite today.

Served through it so far: notes, pending rollovers and usage. The journal (tasks, agents, windows, items, branches,
response-id aliases) and the compaction records are the next parts (ADR 0013, "Order of the rest"); until each
is behind this interface, `--store` shares only these parts (ADR 0013, "Wiring").

Errors are the embedded store's, word for word, whichever implementation raises them: `NoteError` for what the
model got wrong about a note (it sees the message), `NotePathError` for a bad path or task id.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal, Protocol, runtime_checkable

from proxy.context.pending import KINDS, Kind, Pending
from proxy.notes.store import NoteInfo, WriteResult
from proxy.usage import Usage

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

    def close(self) -> None: ...
