"""Compaction's own steps in the window service (issue 29: moved out of addons/compaction.py): the checkpoint
in effect projected for a request, the window learned from an overflow, compaction's events, and the order
its threshold and overflow recovery give the one compaction path (`service.compact_and_open`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from proxy import dbworker, debuglog
from proxy.items.lazyitems import as_list
from proxy.metrics import proxy_metrics
from proxy.windows import opening, service
from proxy.windows.host import WindowHost
from proxy.windows.remote import journal_link, store
from proxy.windows.remote.bookkeeping import records_on, shared_records, write_op
from proxy.windows.remote.bootstraps import ProjectionContext, apply_projection
from proxy.windows.remote.decision import choose_boundary
from proxy.windows.remote.eligibility import remote_blocked
from proxy.windows.remote.fingerprint import compatible
from proxy.windows.remote.flowinfo import FlowInfo
from proxy.windows.remote.store import Checkpoint


def db_of(rt: WindowHost) -> dbworker.DBWorker:
    return dbworker.shared(rt.services, rt.state.db_path)


def write(rt: WindowHost, fn: Callable[[Any], Any], latest: Hashable | None = None) -> None:
    """A write of compaction's records (`fn` is given the `CompactionBackend`) on the database thread: in its
    batched transaction on the embedded store, through the store's backend on another (`--store`); coalesced
    with earlier writes under the same `latest` key."""
    op = write_op(shared_records(rt.state_store()), fn)
    db = db_of(rt)
    if latest is not None:
        db.put_latest(latest, op)
    else:
        db.submit(op)


async def read(rt: WindowHost, db: dbworker.DBWorker, fn: Callable[[Any], Any]) -> Any:
    """A read of compaction's records on the database thread (after the writes pending there)."""
    shared = shared_records(rt.state_store())
    return await db.run(lambda conn: fn(records_on(shared, conn)))


def project(rt: WindowHost, payload: dict[str, Any], cp: Checkpoint | None, info: FlowInfo, enabled: bool,
            report_divergence: bool = True) -> dict[str, Any]:
    """The checkpoint in effect projected onto `payload` (its opaque item replayed where the fingerprints
    match); `info` records the outcome. A diverged history is sent as it is, and reported."""
    info.checkpoint, info.replay_opaque = None, False
    if cp is None:
        return payload
    replay = bool(enabled and info.route.eligible and cp.compaction_item is not None
                  and cp.fingerprint is not None and info.fingerprint is not None
                  and compatible(cp.fingerprint, info.fingerprint))
    projected, outcome = apply_projection(payload, ProjectionContext(cp.record(), replay))
    if outcome == "diverged" and (moved := journal_link.journal_boundary(info.mark, cp)) is not None:
        # The journal aligned this request with the window's boundary item elsewhere (the agent left out
        # an item the journal keeps): the boundary follows the journal, for this request's items.
        cp = moved
        projected, outcome = apply_projection(payload, ProjectionContext(cp.record(), replay), checked=True)
    info.outcome = outcome
    if outcome == "diverged":
        # The client's history no longer starts with the compacted items: send it as it is.
        if report_divergence:
            event(rt, info, "projection", "diverged", None, cp.id)
        return payload
    info.checkpoint, info.replay_opaque = cp, replay and outcome in ("remote", "already")
    return projected


# How long a window learned from an upstream (per model and endpoint) is trusted as this process read it. Another
# process or instance on the same store may learn a smaller one: it is read again from the store after this many
# seconds, so a window learned anywhere is applied by every instance's requests from then on, without a restart.
# One read per model and endpoint per period: nothing per request.
LEARNED_WINDOW_FRESH_S = 2.0


async def learned_window(rt: WindowHost, db: dbworker.DBWorker, model: str, endpoint: str) -> int | None:
    """The smallest window an upstream showed for (model, endpoint), this process's or the store's (any instance's:
    read again after LEARNED_WINDOW_FRESH_S)."""
    cache = rt.services.compaction_windows
    k = (model, endpoint)
    hit = cache.get(k)
    now = time.monotonic()
    if hit is not None and now - hit[1] < LEARNED_WINDOW_FRESH_S:
        return hit[0]
    stored = await read(rt, db, lambda rec: rec.learned_window(model, endpoint))
    mine = cache.get(k, (None, 0.0))[0]  # (one this process learned meanwhile: its write may still be queued)
    value = stored if mine is None else mine if stored is None else min(stored, mine)
    cache[k] = (value, now)
    return value


def learn(rt: WindowHost, info: FlowInfo, tokens: int) -> None:
    """The upstream answered context_length_exceeded at `tokens` (estimated): remember it per model
    and endpoint, in this process and in the compaction store."""
    model = info.fingerprint.model if info.fingerprint else str(info.payload.get("model") or "")
    endpoint = info.endpoint
    if not model or not endpoint or tokens <= 0:
        return
    cache = rt.services.compaction_windows
    old, read_at = cache.get((model, endpoint), (None, 0.0))
    cache[(model, endpoint)] = (tokens if old is None else min(old, tokens), read_at)
    if info.window is None or tokens < info.window:
        info.window = tokens
    write(rt, lambda rec: rec.learn_window(model, endpoint, tokens))
    debuglog.event("overflow_recovery", phase="window", outcome="learned", window=cache[(model, endpoint)][0])

def blocked(info: FlowInfo, rt: WindowHost) -> str | None:
    # the one rule (proxy/windows/remote/eligibility.py), shared with the context stage's hard trigger
    return remote_blocked(rt.config.remote_compaction, info.route.eligible, info.fingerprint)

async def compact(rt: WindowHost, info: FlowInfo, request_payload: dict[str, Any], reason: str) -> Checkpoint:
    """Compaction's threshold or overflow recovery: the order for the one compaction path (service.py)."""
    prev = info.checkpoint
    info.client_items = as_list(info.client_items)  # (recovery may come here with a big input not built)
    boundary = choose_boundary(info.client_items, prev.boundary if prev else 0, info.window or 0)
    notes = None
    w = info.windows
    # An overflow opens the window the agent did not ask for: with context on it gets the notes parts of the
    # one bootstrap builder (identity, notes index, continuation). A threshold compaction (remote_compaction's
    # own) replays the compaction output exactly, as the protocol does.
    if w is not None and rt.config.context.enabled and reason == "overflow":
        notes = opening.window_notes_for(rt.state_store(), w.task_id, w.address,
                                         opening.reachable_context_tools(request_payload,
                                                                         rt.config.bridge.families), reason)
    order = service.CompactionOrder(
        windows=w, session_key=info.session_key, items=info.client_items, boundary=boundary, previous=prev,
        replay_opaque=info.replay_opaque, payload=request_payload, window=info.window,
        fingerprint=info.fingerprint, target=info.target, remote_blocked=blocked(info, rt), reason=reason,
        notes=notes, journal_required=False)  # unjournaled, the checkpoint still serves this request
    deps = service.deps_of(rt, info.route, info.credentials_allowed, w.journal if w is not None else None)
    cp = await service.compact_and_open(deps, order)  # the one compaction path (proxy/windows/service.py)
    info.compacted, info.compacted_items = True, len(info.client_items)
    return cp

def event(rt: WindowHost, info: FlowInfo, kind: str, outcome: str, reason: str | None,
           cp_id: str | None) -> None:
    key = info.session_key
    write(rt, lambda rec: rec.record_event(key, kind, outcome, reason, cp_id))
    journal_link.record_event(info.windows, kind, {"outcome": outcome, "reason": reason, "checkpoint_id": cp_id})
    debuglog.event("remote_compaction", phase=kind, outcome=outcome, reason=reason, checkpoint=cp_id)
    if kind == "recovery":  # every outcome of an overflow recovery, made a compaction or not
        proxy_metrics().overflow_recovery(outcome)



def record_forwarded(rt: WindowHost, info: FlowInfo, sess: store.SessionRecord | None, n_items: int, sent: int,
                     compacted: bool) -> None:
    """What went up for the session (coalesced: its newest row is all that counts; the write closes over the count,
    never over the items, which would live until its batch), and compaction's memo of it."""
    key = info.session_key
    cp_id = info.checkpoint.id if info.checkpoint else None
    write(rt, lambda rec: rec.record_forwarded(key, cp_id, n_items, sent), latest=("forwarded", key))
    memo = service.session_memo(rt)
    if compacted:  # a compaction wrote more than record_forwarded does: read it back next time
        memo.forget(key)
    else:  # mirror exactly what record_forwarded writes, so the next request can skip the read
        memo.put(key, store.SessionRecord(store.LastRequest(cp_id, n_items, sent), False,
                                          sess.failed_items if sess is not None else None, info.compacted_items))
