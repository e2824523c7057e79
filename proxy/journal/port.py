"""The port the stores implement for the journal (ADR 0013, ADR 0014): what the journal's writer applies and what
its readers read, whichever store holds it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from proxy.journal.model import Window
from proxy.journal.ops import Op, PutWindow
from proxy.journal.query import HistoryReader
from proxy.state import StoreKind


@runtime_checkable
class JournalBackend(Protocol):
    """The journal (proxy/journal/): its writes are the typed ops of proxy/journal/ops.py, applied in one
    transaction per batch by the writer thread; its reads are the journal's (a session, its branch and windows,
    raw and call items, the session of a response id, events) and the history tools' (`history()`).

    Contract (both implementations, tests/proxy/store/test_store_journal.py):
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
