"""What a pending rollover is (proxy/windows/notes/rollover.py keeps them): its kinds and its record, shared by the
store interface (proxy/store/interface.py) and both stores without importing the embedded store's statements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["new_context", "checkpoint"]
KINDS: tuple[Kind, ...] = ("new_context", "checkpoint")


@dataclass(frozen=True)
class Pending:
    task_id: str
    address: str
    kind: Kind
    origin: str
    window_id: str | None
    requested_at: float

    @property
    def checkpoint(self) -> bool:
        """The proxy runs the checkpoint turn before rolling over (a manual checkpoint)."""
        return self.kind == "checkpoint"
