"""Compaction's windows, in the journal: the only place windows live (ADR 0006).

A checkpoint is a journal window with strategy `remote` or `fallback`. The window belongs to the
journal session of the request: the one the history stage resolved (its `RequestMark`), or, when
history is not in the chain, the one the journal resolves the same way (the journal then holds the
session and its windows, without items). The journal also gets the compaction and recovery events.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.journal import JoinError, Journal, RequestMark, Window
from proxy.session import SessionIdentity
from proxy.windows.remote.store import Checkpoint

log = logging.getLogger("ctproxy.compaction")


@dataclass(frozen=True)
class WindowSession:
    """The journal session whose windows a request's compaction reads and opens."""

    journal: Journal
    key: str  # the journal session key: the root of its one hash chain
    task_id: str
    address: str
    source: str | None
    mark: RequestMark | None  # the history stage's mark of this request, when it ran


def window_session(journal: Journal, mark: RequestMark | None, ident: SessionIdentity,
                   headers: Callable[[], Mapping[str, str]], payload: Mapping[str, Any]) -> WindowSession | None:
    """The request's journal session: the history stage's mark when it ran, else resolved here (`headers`
    is called only then: building the merged map cost every request a dict it rarely needed). `journal`:
    `proxy.windows.service.journal_of` (the history stage's, or the one kept without it)."""
    if isinstance(mark, RequestMark):
        return WindowSession(journal, mark.session_key, mark.task_id, mark.address, ident.source, mark)
    try:
        key, task_id, address = journal.resolve(ident, headers(), payload)
    except JoinError:
        return None  # a request the history stage would refuse: no window of its own either
    return WindowSession(journal, key, task_id, address, ident.source, None)


def current_checkpoint(ws: WindowSession | None) -> Checkpoint | None:
    """The checkpoint in effect: the session's current window, when it is a remote/fallback one."""
    if ws is None:
        return None
    w = ws.mark.state.window if ws.mark is not None and ws.mark.state is not None else ws.journal.window_of(ws.key)
    return Checkpoint.from_window(w) if w is not None else None


def open_window(ws: WindowSession, cp: Checkpoint,
                notes: Callable[[Window | None, str], dict[str, Any]] | None = None) -> Checkpoint:
    """Open the session's next window for `cp` (its boundary after `cp.boundary` agent items); returns
    the checkpoint as the window records it. `notes`: the builder of the window's notes parts
    (proxy/windows/opening.py), when the context capability manages the session's windows."""
    j = ws.journal
    j.session(ws.key, ws.task_id, ws.address, ws.source)  # created when history is not in the chain
    boundary_item = None
    mark = ws.mark
    if mark is not None and 0 < cp.boundary <= len(mark.input_ids):
        boundary_item = mark.input_ids[cp.boundary - 1] or None  # the journal's own id of that item
    base = cp.bootstrap()

    def with_notes(prev: Window | None, window_id: str) -> dict[str, Any]:
        return {**base, **notes(prev, window_id)} if notes is not None else base

    w = j.start_window(ws.key, boundary_item, cp.strategy, with_notes, boundary_pos=cp.boundary,
                       boundary_hash=cp.boundary_hash, reason=cp.reason, opaque=cp.compaction_item)
    return dataclasses.replace(cp, window_id=w.window_id, created_at=w.created_at,
                               boundary_item_id=w.boundary_item_id, preface=tuple(w.bootstrap.get("preface") or ()),
                               coda=tuple(w.bootstrap.get("coda") or ()))


def journal_boundary(mark: RequestMark | None, cp: Checkpoint) -> Checkpoint | None:
    """`cp` with its boundary where the journal's alignment of this request puts its boundary item, when
    the positional check failed but the journal sees the same branch (the agent left out an item the
    journal keeps: a reasoning item, a hosted tool's record). None when the journal does not find it
    either (a real edit). Settles the request's alignment: paid only when the positional check fails."""
    if mark is None or cp.boundary_item_id is None:
        return None
    try:
        k = mark.position_of(cp.boundary_item_id)
    except Exception:  # the journal is a record: never a reason to fail a request
        return None
    if k is None or k + 1 == cp.boundary:
        return None
    return dataclasses.replace(cp, boundary=k + 1)


def record_event(ws: WindowSession | None, kind: str, detail: dict[str, Any]) -> None:
    """`detail` holds categories, counts and ids only."""
    if ws is None:
        return
    try:
        ws.journal.record_event(ws.key, kind, detail)
    except Exception:  # the journal is a record, never a reason to fail a request
        log.warning("journal: could not record a %s event", kind)
