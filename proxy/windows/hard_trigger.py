"""The context stage's compaction at a rollover (issue 29: moved out of addons/context.py): the hard trigger or a
manual checkpoint under strategy `remote` / `fallback`, and a checkpoint turn that wrote nothing. One order for
the one compaction path (`service.compact_and_open`); the addon reads the flow and writes back what it returns.

Also the trigger's decision itself (`usage_ratio`, `hard_due`): the one rule with compaction (ADR 0011 decision 11,
docs/context.md "One estimate, one window"): the request's estimate (the decision's: the last usage plus the new
items, calibrated) against the decision's window, once the session has a usage in its current window, and the
agent's items since a new window's boundary weighing something."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mitmproxy import http

from proxy import routes
from proxy import usage as usage_store
from proxy.items.inputs import approx_tokens_for_bytes, input_items, items_bytes
from proxy.journal import Window
from proxy.metrics import proxy_metrics
from proxy.windows import budget, opening, service
from proxy.windows.apply import apply_window
from proxy.windows.decision import WindowDecision
from proxy.windows.host import WindowHost
from proxy.windows.notes import bootstrap as boot
from proxy.windows.notes import reminder
from proxy.windows.notes.decorate import decorate
from proxy.windows.projection import CONTEXT_REASON, stored_projection
from proxy.windows.remote import journal_link
from proxy.windows.remote.bootstraps import ProjectionContext, apply_projection
from proxy.windows.remote.decision import TAIL_FRACTION
from proxy.windows.remote.eligibility import remote_call
from proxy.windows.remote.fingerprint import load_key

log = logging.getLogger("ctproxy.context")


def usage_ratio(last: usage_store.Usage | None, model: Any, windows: Any, ratio: float,
                current: Callable[[], Window | None], decided: WindowDecision | None = None,
                learned: int | None = None) -> tuple[int, int] | None:
    """(tokens, window) when the request reaches `ratio` of its window; else None. Only once the session's last
    recorded answer is in its current window (`current()`, read only when needed; a usage older than the window
    is the old window's). The tokens are the request's estimate, the one kind compaction decides on: the
    decision's (`decided.estimate`: the last usage plus the new items' bytes, calibrated per session) against the
    decision's window (the model table's, or smaller once an overflow taught it); without a decision (compaction
    not in the chain, or it left the request alone) the last usage alone against the one effective window
    (`budget.effective_window`: the table's, or the one `learned` from an overflow)."""
    if last is None:
        return None
    est = decided.estimate if decided is not None else None
    if est is not None and decided is not None and decided.window:
        used, window = est.tokens, decided.window
    else:
        used = last.input_tokens + last.output_tokens
        window = budget.effective_window(model if isinstance(model, str) else last.model, windows, learned)
    if window is None or not reminder.reminder_due(used, window, ratio):
        return None
    w = current()
    if w is not None and w.created_at > last.updated_at:
        return None  # the usage predates the current window (a rollover since)
    return used, window


def hard_due(used: tuple[int, int] | None, current: Window | None, items: list[Any]) -> bool:
    """The hard trigger is reached. Right after a new window, a second one helps only when the agent's items
    since its boundary weigh something (compaction's rule, TAIL_FRACTION of the window): a bootstrap that alone
    is above the hard trigger would otherwise make every request run a checkpoint turn or compact (never a
    loop)."""
    if used is None:
        return False
    if current is None or current.boundary_pos is None or current.boundary_pos > len(items):
        return True
    return approx_tokens_for_bytes(items_bytes(items[current.boundary_pos:])) >= TAIL_FRACTION * used[1]


def _seen(rt: WindowHost, ws: journal_link.WindowSession, items: list[Any], n: int) -> list[Any] | None:
    """What the model sees of `items[:n]` in a notes window (its bootstrap, then the agent's items after its
    boundary); None when the current window is not a notes window that applies."""
    w = ws.journal.window_of(ws.key)
    proj = stored_projection(w, rt) if w is not None and w.strategy == "notes" else None
    if proj is None or proj.boundary > n:
        return None
    out, outcome = apply_window({"input": items[:n]}, proj)
    return out["input"] if outcome == "applied" else None


@dataclass(frozen=True)
class Compacted:
    strategy: str  # the strategy made, or `none`
    decision: WindowDecision | None = None  # the request's decision derived (None: there was none to derive)
    forwarded: dict[str, Any] | None = None  # the request to send in the new window


async def compact_at_rollover(rt: WindowHost, ws: journal_link.WindowSession, payload: dict[str, Any],
                              decided: WindowDecision | None, kind: str, remote: bool, route: routes.Route,
                              allowed: bool, request: http.Request, headers: Mapping[str, str],
                              session_key: str | None, gateway_key: str | None = None) -> Compacted:
    """Compact the session's window at the rollover boundary and forward this request in the new one: remote
    compaction v2 where eligible (compaction's one rule, proxy/windows/remote/eligibility.py) and `remote`, else
    the readable fallback (no upstream call). At most one compaction per agent request: none when compaction
    already compacted this one."""
    items = input_items(payload)
    n = boot.rollover_boundary(items) if items else 0
    if not items or n == 0:
        return Compacted("none")
    if decided is not None and decided.compacted:
        return Compacted("none")  # compaction compacted this request already: never a second one
    previous = journal_link.current_checkpoint(ws)
    if previous is not None and previous.boundary >= n:
        return Compacted("none")
    model = payload.get("model") if isinstance(payload.get("model"), str) else ""
    window = decided.window if decided is not None else budget.effective_window(
        model, rt.config.model_windows, budget.learned_in_process(rt.services, model))
    if rt.services.compaction_key is None:
        rt.services.compaction_key = load_key(rt.state.root)
    call = remote_call(rt.config.remote_compaction, route, request.scheme, request.host, request.port, request.path,
                       headers, allowed, model, rt.services.compaction_key, gateway_key)
    reason = f"{CONTEXT_REASON}{kind}"
    order = service.CompactionOrder(
        windows=ws, session_key=session_key if session_key is not None else ws.key, items=items, boundary=n,
        previous=previous, replay_opaque=bool(decided is not None and decided.replay_opaque and previous is not None),
        payload=payload, window=window, fingerprint=call.fingerprint, target=call.target,
        remote_blocked=call.blocked if remote else "strategy_fallback", reason=reason,
        notes=opening.window_notes_for(rt.state_store(), ws.task_id, ws.address,
                                       opening.reachable_context_tools(payload, rt.config.bridge.families), reason),
        seen=_seen(rt, ws, items, n))
    try:  # the one compaction path (proxy/windows/service.py)
        cp = await service.compact_and_open(service.deps_of(rt, route, allowed, ws.journal), order)
    except Exception:  # the journal or the engine refused: the caller falls back to a notes window
        log.warning("context: a compaction at the hard trigger could not be opened")
        return Compacted("none")
    proxy_metrics().rollover(cp.strategy)
    replay = cp.strategy == "remote"
    derived = None
    if decided is not None:  # the decision derived: overflow recovery and the request log see this window
        derived = dataclasses.replace(decided, checkpoint=cp, replay_opaque=replay, outcome=cp.strategy,
                                      compacted=True, compacted_items=len(items), fit_budget=None)
    out, _ = apply_projection(payload, ProjectionContext(cp.record(), replay), checked=True)
    out = decorate(payload, out, ws, rt.config.bridge.families, rt.config.context.id_projection, None)
    return Compacted(cp.strategy, derived, out)
