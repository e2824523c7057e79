"""Tells the history journal about compactions and recoveries, when the journal is part of the chain.

The history addon leaves a `RequestMark` (journal ids of the request's input items) in the flow
state (`FlowState.journal_mark`); with it a compaction opens the session's next window at the journal
id of its boundary item. Without it (an addon loaded alone) only the compaction tables hold the record.
"""

from __future__ import annotations

import logging
from typing import Any

from proxy.state import StateDir

log = logging.getLogger("ctproxy.compaction")


def _journal(state: StateDir) -> Any | None:
    try:
        from proxy.journal import journal_for
    except ImportError:
        return None
    return journal_for(state)


def record_event(state: StateDir, mark: Any | None, kind: str, detail: dict[str, Any]) -> None:
    """`detail` holds categories, counts and ids only."""
    if mark is None:
        return
    journal = _journal(state)
    if journal is None:
        return
    try:
        journal.record_event(mark.session_key, kind, detail)
    except Exception:  # the journal is a record, never a reason to fail a request
        log.warning("journal: could not record a %s event", kind)


def start_window(state: StateDir, mark: Any | None, boundary: int, strategy: str,
                 bootstrap: dict[str, Any]) -> str | None:
    """Open the window that starts after the `boundary` client items; returns its id."""
    if mark is None or boundary <= 0 or boundary > len(mark.input_ids):
        return None
    journal = _journal(state)
    if journal is None:
        return None
    try:
        return journal.start_window(mark.session_key, mark.input_ids[boundary - 1] or None, strategy,
                                    bootstrap).window_id
    except (KeyError, ValueError):
        log.warning("journal: the compaction boundary is not on the session's branch; no window opened")
        return None
