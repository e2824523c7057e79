"""The port the stores implement for pending rollovers (ADR 0013, ADR 0014): `new_context` and manual
checkpoints, one per agent of a task."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from proxy.windows.notes.pending import KINDS, Kind, Pending


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
