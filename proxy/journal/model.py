"""The journal's typed records of a session and its windows (kept apart from `journal.py`, so the backlog
can name them without importing the journal)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Literal

from proxy.journal.branch import Branch

# How a window was made (the one definition; ADR 0011). `start`: a session's first window; `client_compaction`:
# the client sent its own compaction item; `notes`: seed 000's checkpoint note and bootstrap; `remote` / `fallback`:
# a compaction v2 item replayed / the readable excerpt.
Strategy = Literal["start", "client_compaction", "notes", "remote", "fallback"]
COMPACTION_STRATEGIES: frozenset[Strategy] = frozenset({"remote", "fallback"})  # a Checkpoint, replayed by compaction


def window_id(ordinal: int) -> str:
    """The id of an agent's window `ordinal` (w1, w2, …): the one spelling, used where the journal opens a
    window (`Journal._new_window`), names the one it is about to open, or files items in the one before."""
    return f"w{ordinal}"


# In a window's bootstrap: the journal id of the last answer item that still belongs to the window before it (a
# bridged turn rolled over mid-turn: its answer, journaled at its end, is filed in both windows, issue 29 (1)).
FILED_AFTER_KEY = "filed_after"


@dataclass(frozen=True)
class Window:
    window_id: str  # "w<ordinal>", unique per agent
    ordinal: int
    session_key: str
    task_id: str
    address: str
    boundary_item_id: str | None  # last journal item (on the branch) the bootstrap replaces (None: nothing)
    strategy: Strategy  # (a row written by another version may hold another word: read as it is)
    bootstrap: dict[str, Any]
    created_at: float
    # A window that replaces agent items when a request is forwarded (remote, fallback, notes): how many
    # of the agent's items, and the one-chain id of the last of them (canonical.chain_at).
    boundary_pos: int | None = None
    boundary_hash: str | None = None
    reason: str | None = None  # a category, never content
    opaque: bytes | None = None  # remote: the compaction item exactly as received


@dataclass
class SessionState:
    key: str
    task_id: str
    address: str
    source: str | None
    entries: Branch
    window: Window
    generation: int = 0  # bumped whenever the branch is rewritten (not merely appended to)
    # set once what the request path wrote for the session (its task, agent and session rows, a window it
    # opened) is committed; None: nothing such is waiting (see `wait_registered`)
    registered: threading.Event | None = None
    # shared sessions (`ctproxy up --workers N`): the other writer's stamp this state was last brought up to
    seen_stamp: tuple[str, int] | None = None
    used_at: float = 0.0  # time.monotonic() of its last request or answer (big idle sessions are let go)
