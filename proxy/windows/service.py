"""The window service (ADR 0011): what the stages share to read, compact and open windows.

- `journal_of`: the journal a request's windows live in.
- `WindowDeps`: what the service needs of the process and of the request (the upstream turns, the route,
  the credential verdict, the journal, the database worker, the tool client), typed and built once per
  request by `deps_of`.
- `compact_and_open`: the one compaction path. Compaction's threshold and overflow recovery
  (addons/compaction.py) and the context stage's hard trigger and failed checkpoint turn (addons/context.py)
  all compact here: the engine (remote compaction v2 where allowed, else the readable fallback), the
  journal's new window, compaction's records.

Kept out of the strategy rooms (`proxy/windows/remote/`, `proxy/windows/notes/`), which take only `WindowDeps`; the
process itself reaches the service as a `WindowHost` (proxy/windows/host.py), never as an import of the runtime."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy import dbworker, routes
from proxy.journal import Journal, Window, journal_for
from proxy.toolclient import ToolClient
from proxy.upstream import UpstreamTurns
from proxy.windows.host import WindowHost
from proxy.windows.remote import journal_link
from proxy.windows.remote.bookkeeping import record_compaction, shared_records
from proxy.windows.remote.engine import Plan, compact, http_caller, retained_budget
from proxy.windows.remote.fingerprint import Fingerprint
from proxy.windows.remote.port import CompactionBackend
from proxy.windows.remote.remote import Target
from proxy.windows.remote.store import Checkpoint, SessionMemo

log = logging.getLogger("ctproxy.windows")


def journal_of(rt: WindowHost, from_history: Journal | None) -> Journal:
    """The journal a request's windows live in: the history stage's, or, when history is not in the chain,
    the one kept here (it then holds the session and its windows, without items)."""
    if isinstance(from_history, Journal):
        return from_history
    j = rt.services.journal
    if j is None:
        j = rt.services.journal = journal_for(rt.state, rt.config.history.cache_mb << 20, rt.state_store().journal())
    return j


def upstream_turns(rt: WindowHost) -> UpstreamTurns:
    """The process's upstream-turn service: every call the window service makes upstream goes through it."""
    if rt.services.upstream is None:
        rt.services.upstream = UpstreamTurns()
    return rt.services.upstream


def session_memo(rt: WindowHost) -> SessionMemo:
    memo = rt.services.compaction_memo
    if memo is None:
        # Another instance on a shared store writes the same sessions: the memo then trusts nothing (ADR 0013).
        shared = True if shared_records(rt.state_store()) is not None else None
        memo = rt.services.compaction_memo = SessionMemo(shared=shared)
    return memo


@dataclass(frozen=True)
class WindowDeps:
    """What the window service is given, instead of reaching into the runtime and the flow (issue 29)."""

    turns: UpstreamTurns = field(repr=False)
    route: routes.Route
    credentials_allowed: bool  # the one credential rule (proxy/routes.py) for the request's own destination
    journal: Journal = field(repr=False)
    db: dbworker.DBWorker = field(repr=False)
    tools: ToolClient | None = field(default=None, repr=False)  # the tool server, where one is known
    memo: SessionMemo | None = field(default=None, repr=False)  # compaction's per-session memo
    compaction_timeout: float = 60.0  # remote_compaction.timeout_seconds
    records: CompactionBackend | None = field(default=None, repr=False)  # the store's (None: embedded, on `db`)


def deps_of(rt: WindowHost, route: routes.Route, credentials_allowed: bool, journal: Journal | None,
            tools: ToolClient | None = None) -> WindowDeps:
    return WindowDeps(upstream_turns(rt), route, credentials_allowed, journal_of(rt, journal),
                      dbworker.shared(rt.services, rt.state.db_path), tools, session_memo(rt),
                      rt.config.remote_compaction.timeout_seconds, shared_records(rt.state_store()))


@dataclass(frozen=True, kw_only=True)
class CompactionOrder:
    """One compaction of a session's window, as a stage asks for it."""

    windows: journal_link.WindowSession | None  # the journal session whose window opens (None: not journaled)
    session_key: str  # compaction's key of the session (its records)
    items: Sequence[Any]  # the agent's items
    boundary: int  # how many of them the new window's bootstrap replaces
    previous: Checkpoint | None
    replay_opaque: bool  # the previous checkpoint's opaque item is what the model sees now
    payload: dict[str, Any]  # the request being served
    window: int | None
    fingerprint: Fingerprint | None
    target: Target | None
    remote_blocked: str | None  # why remote compaction is not tried (category), else None
    reason: str
    notes: Callable[[Window | None, str], dict[str, Any]] | None = None  # the notes parts of the bootstrap
    seen: Sequence[Any] | None = None  # what the model sees before the boundary, when the caller knows better
    journal_required: bool = True  # a window the journal refuses fails the order (else: logged, not journaled)


async def compact_and_open(deps: WindowDeps, order: CompactionOrder) -> Checkpoint:
    """The one compaction path: compact (never raises for upstream trouble: a readable fallback then), open
    the journal's next window for it, write compaction's records. Raises only when the journal refuses the
    window and `journal_required`; the records are bookkeeping and never fail it."""
    key = order.windows.key if order.windows is not None else order.session_key
    plan = Plan(session_key=key, client_items=order.items, previous=order.previous,
                replay_opaque=order.replay_opaque, boundary=order.boundary, payload=order.payload,
                window=order.window, fingerprint=order.fingerprint, target=order.target,
                remote_blocked=order.remote_blocked, reason=order.reason, retained_budget=retained_budget(order.window),
                seen=order.seen)
    cp = await compact(plan, http_caller(deps.turns, deps.compaction_timeout))
    if order.windows is not None:  # the window is the checkpoint's only record (ADR 0006)
        try:
            cp = journal_link.open_window(order.windows, cp, order.notes)
        except Exception as exc:
            if order.journal_required:
                raise
            log.error("windows: the window was not journaled (%s)", type(exc).__name__)
    try:
        await record_compaction(deps.db, deps.memo, order.session_key, order.windows, cp, len(order.items),
                                order.boundary, remote_tried=order.remote_blocked is None, records=deps.records)
    except Exception:  # compaction's records are bookkeeping: the window is open
        log.warning("windows: a compaction's records were not written")
    return cp
