"""The context stage (DESIGN §3.3, ADR 0006): applies the session's current window to the request.

The journal's windows are the only windows; the stage replaces the agent's items before the current
window's boundary by the window's bootstrap (`proxy/transforms/window.py`, a pure transform), when the
agent's items still start with what the window covers (the one hash chain); otherwise nothing is
replaced and the journal records why (`projection`/`diverged`).

In the chain it runs after compaction, which decides for the request (the checkpoint in effect, whether
its opaque item may be replayed, how far its bootstrap gives way) and may just have opened a new window:
this stage applies that decision. Without a compaction decision (loaded alone, `mitmdump -s
addons/context.py`) it finds the session's current window itself and applies its readable bootstrap
(an opaque item is replayed only where compaction has checked the fingerprint).

A strategy is one entry of `PROJECTIONS`: window → `WindowProjection` (or None: not applied now).
remote/fallback are compaction's (its decision applies them in the chain); any other strategy (notes,
issue 13) is applied from the session's current window whether or not compaction decided, e.g.
`PROJECTIONS["notes"] = stored_projection` for a window whose bootstrap JSON holds `{"items": [...]}`.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from mitmproxy import http

from addons._flow import header_map, session_of
from addons._stage import Stage
from proxy import debuglog, runtime
from proxy.compaction import journal_link
from proxy.compaction.flowinfo import FlowInfo
from proxy.compaction.store import Checkpoint
from proxy.flowbody import commit_if_alone, responses_body
from proxy.flowstate import state_of
from proxy.journal import Window
from proxy.journal.canonical import session_root
from proxy.transforms.compaction import ProjectionContext, apply_projection, fit_projection
from proxy.transforms.items import client_compacts, input_items
from proxy.transforms.window import WindowProjection, apply_window

log = logging.getLogger("ctproxy.context")

REPORTED_WINDOWS = 4096  # windows whose divergence this process has recorded (once each)


def _checkpoint_projection(w: Window, rt: runtime.Runtime) -> WindowProjection | None:
    """remote / fallback, alone: the readable bootstrap, while compaction or overflow recovery is on."""
    cfg = rt.config.remote_compaction
    cp = Checkpoint.from_window(w)
    if cp is None or not (cfg.enabled or cfg.recover_overflow):
        return None
    return cp.record().projection(replay_opaque=False)


def stored_projection(w: Window, rt: runtime.Runtime) -> WindowProjection | None:
    """A window whose bootstrap is stored whole (`bootstrap["items"]`, built when the window was opened)."""
    items = w.bootstrap.get("items")
    if w.boundary_pos is None or not w.boundary_hash or not isinstance(items, list):
        return None
    return WindowProjection(w.window_id, w.boundary_pos, w.boundary_hash, session_root(w.session_key),
                            tuple(items))


COMPACTION_STRATEGIES = frozenset({"remote", "fallback"})  # decided by the compaction stage in the chain
PROJECTIONS: dict[str, Callable[[Window, runtime.Runtime], WindowProjection | None]] = {
    "remote": _checkpoint_projection,
    "fallback": _checkpoint_projection,
}


def project_decision(payload: dict[str, Any], info: FlowInfo) -> dict[str, Any]:
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


class Context(Stage):
    def __init__(self) -> None:
        self._reported: OrderedDict[str, None] = OrderedDict()

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        st = state_of(flow)
        info = st.compaction
        if isinstance(info, FlowInfo) and info.checkpoint is not None:  # compaction decided: apply that
            body = responses_body(flow)
            if body is None:
                return
            projected = project_decision(body.value, info)
            if projected is not body.value:
                body.replace(projected)
                commit_if_alone(flow)
            return
        self._current(flow, decided=isinstance(info, FlowInfo))

    def _current(self, flow: http.HTTPFlow, decided: bool) -> None:
        """The session's current window, found here. `decided`: compaction has decided this request (no
        checkpoint in effect, or a diverged one): only the other strategies are left to apply."""
        rt = self.rt
        others = _other_strategies()
        cfg = rt.config.remote_compaction
        if not others and (decided or not (cfg.enabled or cfg.recover_overflow)):
            return  # no strategy could apply: the body need not even be parsed
        body = responses_body(flow)
        if body is None:
            return
        payload = body.value
        if input_items(payload) is None or payload.get("previous_response_id") or payload.get("conversation"):
            return  # stateful requests: the upstream holds the history, there is nothing to replace
        if client_compacts(payload):
            return
        ident = session_of(flow, rt.services.response_aliases)
        if ident is None:
            return
        st = state_of(flow)
        ws = journal_link.window_session(rt, st.journal, st.journal_mark, ident,
                                         {**header_map(flow), **st.identity_headers}, payload)
        if ws is None:
            return
        w = ws.mark.state.window if ws.mark is not None and ws.mark.state is not None else ws.journal.window_of(ws.key)
        if w is None or (decided and w.strategy in COMPACTION_STRATEGIES):
            return
        make = PROJECTIONS.get(w.strategy)
        proj = make(w, rt) if make is not None else None
        if proj is None:
            return
        projected, outcome = apply_window(payload, proj)
        if outcome == "diverged" and (cp := Checkpoint.from_window(w)) is not None:
            moved = journal_link.journal_boundary(ws.mark, cp)  # the journal's alignment, as compaction does
            if moved is not None:
                proj = moved.record().projection(replay_opaque=False)
                projected, outcome = apply_window(payload, proj, checked=True)
        debuglog.event("context", outcome=outcome, strategy=w.strategy, window=w.window_id)
        if outcome == "diverged":
            self._report(ws, w)
        elif outcome == "applied":
            body.replace(projected)
            commit_if_alone(flow)

    def done(self) -> None:
        rt = self._rt
        if rt is not None and rt.services.journal is not None:  # the divergences recorded, loaded alone too
            rt.services.journal.flush(timeout=30)

    def _report(self, ws: journal_link.WindowSession, w: Window) -> None:
        """The agent's items no longer start with what the window covers: said once per window."""
        key = f"{ws.key}\x00{w.window_id}"
        if key in self._reported:
            return
        self._reported[key] = None
        while len(self._reported) > REPORTED_WINDOWS:
            self._reported.popitem(last=False)
        journal_link.record_event(ws, "projection", {"outcome": "diverged", "window_id": w.window_id,
                                                     "strategy": w.strategy})


def _other_strategies() -> bool:
    """A strategy not decided by compaction is registered (notes, issue 13)."""
    return any(s not in COMPACTION_STRATEGIES for s in PROJECTIONS)


addons = [Context()]
