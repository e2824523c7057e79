"""The store as the window feature sees it (ADR 0014): the parts a window reads and writes at its opening, its
checkpoints and its compactions. The stores (proxy/store/) implement it; the window feature never imports them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from proxy.journal.port import JournalBackend
from proxy.notes.port import NotesBackend
from proxy.state import StoreKind
from proxy.usage import UsageBackend
from proxy.windows.notes.port import RolloverBackend
from proxy.windows.remote.port import CompactionBackend


@runtime_checkable
class WindowStore(Protocol):
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
