"""Journal write operations: built on the request path (cheap), applied by the writer thread."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class EnsureTask:
    task_id: str
    origin: str
    created_at: float


@dataclass(frozen=True)
class EnsureAgent:
    task_id: str
    address: str
    created_at: float


@dataclass(frozen=True)
class EnsureSession:
    session_key: str
    task_id: str
    address: str
    source: str | None
    created_at: float


@dataclass(frozen=True)
class PutWindow:
    task_id: str
    address: str
    window_id: str
    ordinal: int
    session_key: str
    boundary_item_id: str | None
    strategy: str
    bootstrap: dict[str, Any]
    created_at: float


@dataclass(frozen=True)
class PutItem:
    item_id: str
    session_key: str
    parent_id: str | None
    window_id: str
    origin: str  # input | output
    raw: bytes  # the item's JSON as sent / received
    canon: str
    response_id: str | None
    created_at: float


@dataclass(frozen=True)
class SetBranch:
    """Replace the session's branch manifest from `from_pos` on with `ids`."""

    session_key: str
    from_pos: int
    ids: tuple[str, ...]
    archived_head: str | None = None  # head of the branch that stops being current
    archived_length: int = 0
    reason: str = "append"


@dataclass(frozen=True)
class PutResponse:
    response_id: str
    session_key: str
    model: str | None
    status: str | None
    usage: dict[str, Any] | None
    error: dict[str, Any] | None
    tail_item_id: str | None
    item_count: int
    incomplete: bool
    created_at: float


@dataclass(frozen=True)
class PutAlias:
    response_id: str
    session_key: str
    created_at: float


@dataclass(frozen=True)
class PutEvent:
    session_key: str
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0


Op = EnsureTask | EnsureAgent | EnsureSession | PutWindow | PutItem | SetBranch | PutResponse | PutAlias | PutEvent
