"""The window decision of one request (issue 29, ADR 0011): made once, frozen, derived, never edited.

Compaction's request hook makes it (the checkpoint in effect, whether its opaque item is replayed, how far
its bootstrap gives way, the estimate); a later step that changes the window (the context stage's
compaction at the hard trigger, overflow recovery) stores a new one made with `dataclasses.replace`. Every
stage reads the flow's current decision (`FlowState.window`) instead of another stage's own record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.windows.remote.decision import Estimate
from proxy.windows.remote.store import Checkpoint


@dataclass(frozen=True, kw_only=True)
class WindowDecision:
    checkpoint: Checkpoint | None = None  # the checkpoint in effect (None when absent or diverged)
    replay_opaque: bool = False  # its opaque compaction item is replayed (fingerprints match)
    outcome: str = "none"  # what the projection made of it: remote | fallback | already | diverged | none
    compacted: bool = False  # this agent request already caused a compaction (at most one per request)
    compacted_items: int | None = None  # agent items at the session's last compaction
    boundary_checked: bool = False  # the checkpoint's boundary was verified for these very items
    fit_budget: int | None = None  # the input-bytes budget its bootstrap gives way to (None: as it is)
    client_items: Sequence[Any] = ()  # the agent's items the decision was made on
    window: int | None = None  # the model's window (learned smaller after an overflow)
    estimate: Estimate | None = None  # the one estimate of the request (rule: docs/context.md)
