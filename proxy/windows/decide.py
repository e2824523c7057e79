"""The compaction decision of one request (seed 004 §5.2, DESIGN §3.3; moved out of addons/compaction.py, issue 42).

`decide` reads the checkpoint in effect (the session's current journal window of strategy remote/fallback,
ADR 0006), estimates the request as it will be projected (retained user messages, then the opaque compaction item
when model, endpoint, account and auth kind match, else the readable fallback), compacts before forwarding above
the threshold (which opens the session's next window), and says whether the answer is held for a possible overflow
recovery. A checkpoint in effect is replayed as it was stored (its bootstrap was sized when its window opened).
It returns the one frozen `WindowDecision` every later stage reads, and compaction's own record (`FlowInfo`) for
its response hooks.
It never writes the body: the context stage applies the window.

The stage (addons/compaction.py) reads the flow into a `DecisionRequest` of plain values; nothing here reads
mitmproxy's flow."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy import debuglog, routes, usage
from proxy.items.inputs import client_compacts, input_items
from proxy.session import SessionIdentity, minted_for
from proxy.windows import budget, compacting, service, sizing
from proxy.windows.host import WindowHost
from proxy.windows.remote import journal_link, store
from proxy.windows.remote.bookkeeping import records_on, shared_records
from proxy.windows.remote.decision import HOLD_FRACTION, Estimate, over
from proxy.windows.remote.fingerprint import fingerprint_of, load_key, normalise_endpoint
from proxy.windows.remote.flowinfo import FlowInfo
from proxy.windows.remote.remote import compaction_target
from proxy.windows.request import RequestBody

if TYPE_CHECKING:
    from proxy.journal import Journal, RequestMark
    from proxy.windows.decision import WindowDecision


@dataclass(frozen=True)
class DecisionRequest:
    """One request as the decision reads it, taken off the flow by the compaction stage."""

    body: RequestBody = field(repr=False)
    session: Callable[[], SessionIdentity | None] = field(repr=False)  # resolved only for a request that may apply
    route: routes.Route
    # the one credential rule for a call to the request's own destination: asked only where the decision applies
    credentials_allowed: Callable[[], bool] = field(repr=False)
    # a trusted gateway's own key for compaction's call (`CTPROXY_UPSTREAM_API_KEY`, proxy/routes.gateway_key)
    gateway_key: Callable[[], str | None] = field(repr=False)
    headers: Mapping[str, str] = field(repr=False)  # lower-case names; never change it
    identity_headers: Mapping[str, str] = field(repr=False)  # x-ctp-* as the client sent them
    journal: Journal | None = field(repr=False)  # the history stage's journal, if it ran
    mark: RequestMark | None = field(repr=False)  # the journal's ids of this request's items
    stored_usage: dict[str, Any] = field(repr=False)  # the request's memo of the stored usage (one read)
    flow_id: str
    scheme: str
    host: str
    port: int
    path: str


@dataclass(frozen=True)
class Decided:
    window: WindowDecision  # the request's one decision (made once; later steps derive from it)
    info: FlowInfo  # compaction's own record, for its response hooks


def stateful(payload: dict[str, Any]) -> bool:
    return bool(payload.get("previous_response_id")) or payload.get("conversation") is not None


def account_key(rt: WindowHost) -> bytes:
    """The per-installation HMAC key of account fingerprints, loaded once per process."""
    key = rt.services.compaction_key
    if key is None:
        key = rt.services.compaction_key = load_key(rt.state.root)
    return key


def _snapshot(records: Any, conn: sqlite3.Connection, key: str, cache: usage.UsageCache,
              memo: dict[str, Any]) -> tuple[store.SessionRecord | None, usage.Usage | None]:
    """On the database thread: the session's compaction record and its stored usage, kept in the request's memo
    (`FlowState.stored_usage`) so the stages after this one do not read it again."""
    if records is None:  # the embedded store: both on the database thread's connection
        memo[key] = usage.last_usage_for_session(conn, key)
        return records_on(None, conn).session_state(key), memo[key]
    both = getattr(records, "session_state_and_usage", None)  # PostgreSQL: the two in one round trip
    if both is not None and cache.backend is not None:
        state, memo[key] = both(key)
        return state, memo[key]
    state = records.session_state(key)
    try:
        memo[key] = cache.stored(key)
    except Exception:  # the store unreachable: what this process knows is the answer (UsageCache.get)
        return state, None
    return state, memo[key]


async def _session_state(rt: WindowHost, key: str, flow_id: str,
                         memo: dict[str, Any]) -> tuple[store.SessionRecord | None, usage.Usage | None]:
    """The session's compaction record and last usage: from this process's memo where it wrote the session's last
    state (or the request opens the session), else one read on the database thread."""
    sess = service.session_memo(rt).get(key)
    if minted_for(key, flow_id):  # a session this request opens: nothing was recorded for it anywhere
        memo.setdefault(key, None)
        return sess, rt.services.usage.get(key, memo)
    if sess is not None:  # no database round trip: this process wrote the session's last state
        return sess, rt.services.usage.get(key, memo)
    records = shared_records(rt.state_store())  # the store's compaction records (None: embedded, on conn)
    cache = rt.services.usage
    sess, last = await compacting.db_of(rt).run(lambda conn: _snapshot(records, conn, key, cache, memo))
    return sess, usage.newest(last, cache.get(key, memo))


async def _window_of(rt: WindowHost, model: str, endpoint: str, route: routes.Route) -> int | None:
    """The one window every reader reads (proxy/windows/budget.effective_window): the configured one, or smaller
    once an upstream showed it."""
    learned = await compacting.learned_window(rt, compacting.db_of(rt), model, endpoint) \
        if route.eligible and model else None
    return budget.effective_window(model, rt.config.model_windows, learned)


async def decide(rt: WindowHost, req: DecisionRequest) -> Decided | None:
    """The request's decision, or None where compaction does not apply (a string input, a request chained by
    `previous_response_id` / `conversation`, one that compacts by itself, no session)."""
    cfg = rt.config.remote_compaction
    recover = rt.config.recovers_overflow()
    body = req.body
    # A big input is read lazily here (its length, its facts, the items since the last request); it is built
    # only where a checkpoint applies or a compaction runs.
    payload = body.view
    items = input_items(payload)
    if items is None or stateful(payload):
        return None
    if client_compacts(payload, body.facts(items) if items is payload.get("input") else None):
        debuglog.event("remote_compaction", outcome="skipped", reason="client_compacts")
        return None
    ident = req.session()
    if ident is None:
        return None
    key = ident.session_key
    sess, last_usage = await _session_state(rt, key, req.flow_id, req.stored_usage)
    # The checkpoint in effect is the journal session's current window (the journal caches it).
    windows = journal_link.window_session(service.journal_of(rt, req.journal), req.mark, ident,
                                          lambda: {**req.headers, **req.identity_headers}, payload)
    checkpoint = journal_link.current_checkpoint(windows)
    if checkpoint is not None:  # the projection rewrites the history: the items themselves
        payload = body.value
        items = input_items(payload) or []
    info = await _record(rt, req, key, payload, items, sess, windows)
    # A divergence is reported once: when the previous request still used the checkpoint.
    report = sess is None or checkpoint is None or sess.last.checkpoint_id == checkpoint.id
    projected = compacting.project(rt, payload, checkpoint, info, cfg.enabled, report)
    if projected is payload and not body.changed and body.source_bytes:
        # The client's own body goes on: its size is known (the fields beyond input, instructions and tools are a
        # rounding error), and serializing 1.5 MB again would cost more than parsing it.
        sent = body.source_bytes
    else:
        sent = sizing.payload_bytes(projected, input_items(projected) or [])
    info.estimate = sizing.estimate_of(sent, info, sess, last_usage)
    want = sizing.wants_compaction(info, sess, len(items), cfg.enabled, cfg.threshold, recover)
    if want:
        payload = body.value
        info.client_items = items = input_items(payload) or []
        cp = await compacting.compact(rt, info, payload, "threshold")
        projected = compacting.project(rt, payload, cp, info, cfg.enabled)
        sent = sizing.payload_bytes(projected, input_items(projected) or [])
        info.estimate = sizing.estimate_of(sent, info, None, None)
    # A checkpoint in effect is replayed as it was stored (issue 47: a refit to the threshold edited the window's
    # prefix every turn). Its bootstrap gives way only where the prefix changes anyway: on the request whose
    # compaction opens the window (an upstream's compaction keeps what it keeps), or on one that would not fit
    # the window at all (HOLD_FRACTION of it: an overflow, its 400 and a retry, would change it too).
    must_fit = want or over(max(info.estimate.tokens, sizing.tokens(sent, info.estimate.ratio)), info.window,
                            HOLD_FRACTION)
    sent, fit_budget = _fit(info, projected, sent, cfg.threshold) if must_fit else (sent, None)
    info.hold = recover and req.route.eligible and over(info.estimate.tokens, info.window, HOLD_FRACTION)
    compacting.record_forwarded(rt, info, sess, len(items), sent, compacted=want)
    decided = sizing.decided(info, info.checkpoint is not None, fit_budget)
    debuglog.event("remote_compaction", outcome=info.outcome, estimate=info.estimate.tokens, window=info.window,
                   checkpoint=info.checkpoint.id if info.checkpoint else None, items=len(items), stream=info.hold)
    return Decided(decided, info)


async def _record(rt: WindowHost, req: DecisionRequest, key: str, payload: dict[str, Any], items: list[Any],
                  sess: store.SessionRecord | None, windows: journal_link.WindowSession | None) -> FlowInfo:
    """Compaction's record of this request, before any estimate: the session, the window, the route and what a
    compaction call to the request's own destination would need (the fingerprint, the target)."""
    model = payload.get("model") if isinstance(payload.get("model"), str) else ""
    endpoint = normalise_endpoint(req.scheme, req.host, req.port, req.path)
    route = req.route
    make_fp = None
    if route.kind is not None and model:
        make_fp = functools.partial(fingerprint_of, route.kind, model, endpoint, req.headers, account_key(rt))
    info = FlowInfo(session_key=key, payload=payload, client_items=items, checkpoint=None,
                    replay_opaque=False, window=await _window_of(rt, model, endpoint, route),
                    estimate=Estimate(0, "bytes", 1.0), make_fingerprint=make_fp, route=route,
                    credentials_allowed=req.credentials_allowed(), hold=False, mark=req.mark,
                    compacted_items=sess.compacted_items if sess is not None else None, endpoint=endpoint,
                    windows=windows)
    if route.kind is not None:
        info.make_target = functools.partial(compaction_target, route.kind, req.scheme, req.host, req.port,
                                             req.path, req.headers, info.credentials_allowed, req.gateway_key())
    return info


def _fit(info: FlowInfo, projected: dict[str, Any], sent: int, threshold: float) -> tuple[int, int | None]:
    """Still above the threshold right after a compaction: the bootstrap gives way (retained messages, then the
    fallback's excerpt). The bytes sent, and the fit's budget (None: no fit)."""
    by_bytes = sizing.tokens(sent, info.estimate.ratio)  # the usage estimate may reflect a fitted retry
    if info.checkpoint is None or not over(max(info.estimate.tokens, by_bytes), info.window, threshold):
        return sent, None
    fitted = sizing.fit(projected, info, threshold * (info.window or 0))
    if fitted is None:
        return sent, None
    projected, fit_budget = fitted
    sent = sizing.payload_bytes(projected, input_items(projected) or [])
    info.estimate = sizing.estimate_of(sent, info, None, None)
    return sent, fit_budget
