"""The port the stores implement for notes (ADR 0013, ADR 0014): the embedded store's note files and PostgreSQL's
rows both serve it; the window feature and the tool server call it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from proxy.notes.store import NoteInfo, WriteResult


@runtime_checkable
class NotesBackend(Protocol):
    """The notes of one task. `address` is the owning agent (`/root`, `/root/<name>`); `rel` its path inside the
    agent's notes, checked by `proxy.notes.paths.check_rel` before anything is read or written.

    Contract (both implementations, tests/proxy/store/test_store_interface.py):
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
