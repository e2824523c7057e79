"""Journal write operations: built on the request path (cheap), applied by the writer thread.

NamedTuples: immutable like the frozen dataclasses they replace, and built in one call (a frozen
dataclass sets each field through `object.__setattr__`; measured, the ops of one turn cost ≈30 µs
from a cold cache that way).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Protocol


class EnsureTask(NamedTuple):
    task_id: str
    origin: str
    created_at: float


class EnsureAgent(NamedTuple):
    task_id: str
    address: str
    created_at: float


class EnsureSession(NamedTuple):
    session_key: str
    task_id: str
    address: str
    source: str | None
    created_at: float


class PutWindow(NamedTuple):
    task_id: str
    address: str
    window_id: str
    ordinal: int
    session_key: str
    boundary_item_id: str | None
    strategy: str
    bootstrap: dict[str, Any]
    created_at: float
    boundary_pos: int | None = None
    boundary_hash: str | None = None
    reason: str | None = None
    opaque: bytes | None = None


class PutItem(NamedTuple):
    item_id: str
    session_key: str
    parent_id: str | None
    window_id: str
    origin: str  # input | output
    raw: bytes  # the item's JSON as sent / received
    canon: str
    response_id: str | None
    created_at: float


class ItemSource(Protocol):
    """Where a PutItems op reads its items' JSON and canonical hashes (proxy.journal.branch.ColumnView)."""

    def raw(self, k: int) -> bytes: ...

    def canon(self, k: int) -> str: ...


class PutItems(NamedTuple):
    """New items one after another (a big input's): written as the `PutItem`s `each()` makes, one at a time, so a
    100,000-item request is neither 100,000 ops nor 100,000 JSON copies waiting in the writer's queue."""

    session_key: str
    parent_id: str | None  # the first item's
    window_id: str
    origin: str
    item_ids: Sequence[str]  # (an ItemIds column: proxy/journal/itemids.py)
    source: ItemSource  # item k's JSON is source.raw(start + k), its canonical hash source.canon(start + k)
    start: int
    response_id: str | None
    created_at: float

    def each(self) -> Iterator[PutItem]:
        parent = self.parent_id
        for k, item_id in enumerate(self.item_ids):
            yield PutItem(item_id, self.session_key, parent, self.window_id, self.origin,
                          self.source.raw(self.start + k), self.source.canon(self.start + k), self.response_id,
                          self.created_at)
            parent = item_id


class SetBranch(NamedTuple):
    """Replace the session's branch manifest from `from_pos` on with `ids`."""

    session_key: str
    from_pos: int
    ids: Sequence[str]  # (an ItemIds column or a tuple)
    archived_head: str | None = None  # head of the branch that stops being current
    archived_length: int = 0
    reason: str = "append"


class PutResponse(NamedTuple):
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


class PutAlias(NamedTuple):
    response_id: str
    session_key: str
    created_at: float


class PutEvent(NamedTuple):
    session_key: str
    kind: str
    detail: dict[str, Any]
    created_at: float


class FileItems(NamedTuple):
    """Items on a session's branch re-filed in `window_id`: the agent's items that follow a new window's
    bootstrap in the request that opened it (a steer, a follow-up), which were journaled before it opened."""

    session_key: str
    item_ids: Sequence[str]
    window_id: str


Op = (EnsureTask | EnsureAgent | EnsureSession | PutWindow | PutItem | PutItems | SetBranch | PutResponse | PutAlias
      | PutEvent | FileItems)
