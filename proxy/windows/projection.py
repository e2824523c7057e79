"""The projection of a session's current window onto a request (issue 29: moved out of addons/context.py).

A strategy is one entry of `PROJECTIONS`: window → `WindowProjection` (or None: not applied now).
remote/fallback are compaction's (its decision applies them in the chain, `project_decision`); any other
strategy (notes, issue 13) is applied from the session's current window (`current`) whether or not
compaction decided, e.g. `PROJECTIONS["notes"] = stored_projection` for a window whose bootstrap JSON holds
`{"items": [...]}`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy import debuglog
from proxy.items.canonical import session_root
from proxy.items.inputs import input_items
from proxy.journal import COMPACTION_STRATEGIES, Window
from proxy.windows.apply import WindowProjection, apply_window
from proxy.windows.decision import WindowDecision
from proxy.windows.host import WindowHost
from proxy.windows.notes import midturn
from proxy.windows.remote import journal_link
from proxy.windows.remote.bootstraps import ProjectionContext, apply_projection, fit_projection
from proxy.windows.remote.store import CONVERSATION_KEY, LEAD_KEY, Checkpoint

CONTEXT_REASON = "context_"  # the reason of a compaction window the context stage opened (context_threshold, …)


def _checkpoint_projection(w: Window, rt: WindowHost) -> WindowProjection | None:
    """remote / fallback, alone: the readable bootstrap, while compaction or overflow recovery is on."""
    cfg = rt.config.remote_compaction
    cp = Checkpoint.from_window(w)
    # the context stage's own compactions (hard trigger, failed checkpoint turn) apply while context is on
    ours = rt.config.context.enabled and (w.reason or "").startswith(CONTEXT_REASON)
    if cp is None or not (cfg.enabled or rt.config.recovers_overflow() or ours):
        return None
    return cp.record().projection(replay_opaque=False)


def stored_projection(w: Window, rt: WindowHost) -> WindowProjection | None:
    """A window whose bootstrap is stored whole (`bootstrap["items"]`, built when the window was opened)."""
    items = w.bootstrap.get("items")
    if w.boundary_pos is None or not w.boundary_hash or not isinstance(items, list):
        return None
    lead = w.bootstrap.get(LEAD_KEY)
    return WindowProjection(w.window_id, w.boundary_pos, w.boundary_hash, session_root(w.session_key),
                            tuple(items), lead=lead if isinstance(lead, int) and 0 < lead <= len(items) else 0,
                            conversation_hash=str(w.bootstrap.get(CONVERSATION_KEY) or ""))


PROJECTIONS: dict[str, Callable[[Window, WindowHost], WindowProjection | None]] = {
    "remote": _checkpoint_projection,
    "fallback": _checkpoint_projection,
    "notes": stored_projection,  # issue 13: the bootstrap built once at the rollover, replayed byte for byte
}
def project_decision(payload: dict[str, Any], info: WindowDecision) -> dict[str, Any]:
    """Compaction's decision applied: its checkpoint's bootstrap (opaque when it may be replayed), given
    way to the budget compaction set. The same pure transforms compaction sized the request with."""
    cp = info.checkpoint
    if cp is None:
        return payload
    out, outcome = apply_projection(payload, ProjectionContext(cp.record(), info.replay_opaque),
                                    checked=info.boundary_checked)
    if info.fit_budget is not None and outcome in ("remote", "fallback"):
        out = fit_projection(out, info.client_items[cp.boundary:], info.fit_budget) or out
    return out


def current(rt: WindowHost, payload: dict[str, Any], ws: journal_link.WindowSession | None, decided: bool,
            window: Window | None, session: Callable[[], journal_link.WindowSession | None],
            built: Callable[[dict[str, Any]], dict[str, Any]],
            report: Callable[[journal_link.WindowSession, Window], None]) -> dict[str, Any]:
    """The session's current window, found here, applied to `payload` (or `payload` itself).
    `decided`: compaction has decided this request (no checkpoint in effect, or a diverged one): only
    the other strategies are left to apply. `session`: the request's window session, found when needed;
    `built`: the payload with its items built; `report`: a divergence said once."""
    others = _other_strategies()
    cfg = rt.config.remote_compaction
    if window is None and not others and (decided or not (cfg.enabled or rt.config.recovers_overflow())):
        return payload  # no strategy could apply
    if input_items(payload) is None:
        return payload
    if ws is None:  # (a window session exists only for a stateless request the client does not compact)
        ws = session()
        if ws is None:
            return payload
    w = window
    if w is None:
        mark = ws.mark
        w = mark.state.window if mark is not None and mark.state is not None else ws.journal.window_of(ws.key)
    if w is None or (window is None and decided and w.strategy in COMPACTION_STRATEGIES):
        return payload
    make = PROJECTIONS.get(w.strategy)
    proj = make(w, rt) if make is not None else None
    if proj is None:
        return payload
    payload = built(payload)  # the window rewrites the history: the items themselves
    projected, outcome = apply_window(payload, proj)
    if outcome == "diverged" and (cp := Checkpoint.from_window(w)) is not None:
        moved = journal_link.journal_boundary(ws.mark, cp)  # the journal's alignment, as compaction does
        if moved is not None:
            proj = moved.record().projection(replay_opaque=False)
            projected, outcome = apply_window(payload, proj, checked=True)
    elif outcome == "diverged" and (anchored := midturn.reanchored(
            input_items(payload) or [], proj,
            w.bootstrap.get(midturn.ANCHORS_KEY) or w.bootstrap.get(midturn.ANCHOR_KEY),
            w.bootstrap.get(midturn.PREFIX_KEY))) is not None:
        projected, outcome = apply_window(payload, anchored, checked=True)  # a mid-turn window, resent
    debuglog.event("context", outcome=outcome, strategy=w.strategy, window=w.window_id)
    if outcome == "diverged":
        report(ws, w)
    elif outcome == "applied":
        return projected
    return payload



def _other_strategies() -> bool:
    """A strategy not decided by compaction is registered (notes, issue 13)."""
    return not PROJECTIONS.keys() <= COMPACTION_STRATEGIES

