"""Remote compaction v2 with a readable fallback, and overflow recovery (seed 004 §5.2, DESIGN §3.3).

request: decides on the projection of the checkpoint in effect (the session's current journal window
of strategy remote/fallback, ADR 0006): retained user messages → the opaque compaction item when
model, endpoint, account and auth kind match, the readable fallback otherwise. It estimates that
request; above the threshold it compacts before forwarding, which opens the session's next window.
The context stage (addons/context.py) then applies the window to the body; this stage never writes
the body. Requests that compact by themselves, or chain with `previous_response_id` / `conversation`,
are left alone.

Overflow recovery: an HTTP 400 `context_length_exceeded` is buffered by mitmproxy anyway, so the
`response` hook can compact, retry once and swap in the retry's answer. Streams are different: once
streaming starts the headers are gone and a stream callable cannot await, so nothing could be sent
after a failed stream. Requests estimated above 90% of the window are therefore not streamed: in
`responseheaders` the stream is switched to buffering (its events are held), and `response` either
recovers a `response.failed` / `error` that came before any output, or releases the held answer
unchanged. Every other request streams untouched. The agent never sees the overflow; if the retry
fails too it gets the original error unchanged.
"""

from __future__ import annotations

import functools
import logging
import math
import sqlite3
import time
from typing import Any

import orjson
from mitmproxy import http

from addons._flow import destination_route, header_map, header_pairs, is_reverse, session_of
from addons._stage import Stage
from proxy import dbworker, debuglog, routes, runtime, usage
from proxy.compaction import journal_link, store
from proxy.compaction.decision import (
    HOLD_FRACTION,
    TAIL_FRACTION,
    Estimate,
    LastRequest,
    UsageSnapshot,
    choose_boundary,
    estimate,
    over,
)
from proxy.compaction.eligibility import remote_blocked
from proxy.compaction.fingerprint import compatible, fingerprint_of, load_key, normalise_endpoint
from proxy.compaction.flowinfo import FlowInfo
from proxy.compaction.overflow import CODE, response_error_code
from proxy.compaction.remote import compaction_target
from proxy.compaction.store import Checkpoint
from proxy.flowbody import responses_body
from proxy.flowstate import Settling, state_of
from proxy.metrics import proxy_metrics
from proxy.sse import ResponseTap
from proxy.transforms.compaction import ProjectionContext, apply_projection, fit_projection
from proxy.transforms.items import approx_tokens_for_bytes, client_compacts, input_items, items_bytes
from proxy.transforms.lazyitems import as_list
from proxy.windows import budget, opening, recovery, service
from proxy.windows.decision import WindowDecision

log = logging.getLogger("ctproxy.compaction")

# An overflow retry sends at most this share of the body that failed: the upstream's real window is
# somewhere below the failed size, and one retry should not have to guess twice.
RETRY_FRACTION = 0.5


def _route(flow: http.HTTPFlow, rt: runtime.Runtime) -> routes.Route:
    route = state_of(flow).route
    if isinstance(route, routes.Route):
        return route
    return destination_route(flow, trusted=rt.upstream.trusted)  # standalone: no routing addon


def _credentials_allowed(flow: http.HTTPFlow, route: routes.Route) -> bool:
    """The guard's rule (the one in proxy/routes.py), for the compaction call to the same destination with
    the same credentials: a key of the wrong kind for that endpoint is refused here as there."""
    req = flow.request
    return routes.may_receive_credentials(req.scheme, req.host, req.port, req.path, route, is_reverse(flow),
                                          header_pairs(flow))


def _stateful(payload: dict[str, Any]) -> bool:
    return bool(payload.get("previous_response_id")) or payload.get("conversation") is not None


def _payload_bytes(payload: dict[str, Any], items: list[Any]) -> int:
    """What the estimate counts: input, instructions and tools, serialized."""
    tools = payload.get("tools") if isinstance(payload.get("tools"), list) else []
    return len(str(payload.get("instructions") or "").encode()) + items_bytes(tools) + items_bytes(items)


def _tokens(n_bytes: int, ratio: float) -> int:
    return math.ceil(approx_tokens_for_bytes(n_bytes) * ratio)


def _fresh(info: FlowInfo) -> bool:
    """New agent items since the session's last compaction (or no compaction in effect)."""
    done = info.compacted_items
    return done is None or info.checkpoint is None or len(info.client_items) > done


def _decided(info: FlowInfo, boundary_checked: bool, fit_budget: int | None = None) -> WindowDecision:
    """The request's window decision, as compaction's record now holds it."""
    return WindowDecision(checkpoint=info.checkpoint, replay_opaque=info.replay_opaque, outcome=info.outcome,
                          compacted=info.compacted, compacted_items=info.compacted_items,
                          boundary_checked=boundary_checked, fit_budget=fit_budget,
                          client_items=info.client_items, window=info.window, estimate=info.estimate)


def _grown(info: FlowInfo) -> bool:
    """A threshold compaction right after another one helps only when the agent's items since then weigh
    something (at least the tail's share of the window): otherwise the new bootstrap is about the old
    one, and the session would compact on every request (openai/codex#40213, #26783)."""
    done = info.compacted_items
    if done is None or info.checkpoint is None or not info.window:
        return True
    added = approx_tokens_for_bytes(items_bytes(info.client_items[done:])) * info.estimate.ratio
    return added >= TAIL_FRACTION * info.window


def _snapshot(conn: sqlite3.Connection, key: str) -> tuple[store.SessionRecord | None, usage.Usage | None]:
    return store.session_state(conn, key), usage.last_usage_for_session(conn, key)


def _memo(rt: runtime.Runtime) -> store.SessionMemo:
    return service.session_memo(rt)


class Compaction(Stage):
    async def done(self) -> None:
        rt = self._rt
        if rt is None:
            return  # never bound: nothing was opened
        turns, rt.services.upstream = rt.services.upstream, None
        if turns is not None:
            await turns.close()
        dbworker.close_shared(rt.services)
        if rt.services.journal is not None:  # the windows opened without the history stage, too
            rt.services.journal.flush(timeout=30)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _db(rt: runtime.Runtime) -> dbworker.DBWorker:
        return dbworker.shared(rt.services, rt.state.db_path)

    @staticmethod
    def _key(rt: runtime.Runtime) -> bytes:
        key = rt.services.compaction_key
        if key is None:
            key = rt.services.compaction_key = load_key(rt.state.root)
        return key

    # ------------------------------------------------------------------ request
    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        rt = self.rt
        cfg = rt.config.remote_compaction
        recover = rt.config.recovers_overflow()
        if not cfg.enabled and not recover:
            return  # nothing to project or hold: the body need not even be parsed
        body = responses_body(flow)
        if body is None:
            return
        debuglog.set_enabled(rt.config.debug)
        # A big input is read lazily here (its length, its facts, the items since the last request); it is
        # built only where a checkpoint applies or a compaction runs.
        payload = body.view
        items = input_items(payload)
        if items is None or _stateful(payload):
            return
        if client_compacts(payload, body.facts(items) if items is payload.get("input") else None):
            debuglog.event("remote_compaction", outcome="skipped", reason="client_compacts")
            return
        ident = session_of(flow, rt.services.response_aliases)
        if ident is None:
            return
        route = _route(flow, rt)
        db = self._db(rt)
        key = ident.session_key
        sess = _memo(rt).get(key)
        if sess is not None:  # this process wrote the session's last state: no database round trip
            last_usage = rt.services.usage.get(key)
        else:
            sess, last_usage = await db.run(lambda conn: _snapshot(conn, key))
            last_usage = usage.newest(last_usage, rt.services.usage.get(key))
        headers = header_map(flow)
        st = state_of(flow)
        mark = st.journal_mark
        # The checkpoint in effect is the journal session's current window (the journal caches it).
        windows = journal_link.window_session(service.journal_of(rt, st.journal), mark, ident,
                                              lambda: {**headers, **st.identity_headers}, payload)
        checkpoint = journal_link.current_checkpoint(windows)
        if checkpoint is not None:  # the projection rewrites the history: the items themselves
            payload = body.value
            items = input_items(payload) or []
        model = payload.get("model") if isinstance(payload.get("model"), str) else ""
        req = flow.request
        endpoint = normalise_endpoint(req.scheme, req.host, req.port, req.path)
        make_fp = None
        if route.kind is not None and model:
            make_fp = functools.partial(fingerprint_of, route.kind, model, endpoint, headers, self._key(rt))
        window = usage.model_window(model, rt.config.model_windows)
        learned = await self._learned_window(rt, db, model, endpoint) if route.eligible and model else None
        if learned is not None and (window is None or learned < window):
            window = learned  # the upstream showed a smaller window than the table says
        info = FlowInfo(session_key=key, payload=payload, client_items=items, checkpoint=None, replay_opaque=False,
                        window=window, estimate=Estimate(0, "bytes", 1.0), make_fingerprint=make_fp, route=route,
                        credentials_allowed=_credentials_allowed(flow, route), hold=False, mark=mark,
                        compacted_items=sess.compacted_items if sess is not None else None, endpoint=endpoint,
                        windows=windows)

        if route.kind is not None:
            info.make_target = functools.partial(compaction_target, route.kind, req.scheme, req.host, req.port,
                                                 req.path, headers, info.credentials_allowed)
        # A divergence is reported once: when the previous request still used the checkpoint.
        report = sess is None or checkpoint is None or sess.last.checkpoint_id == checkpoint.id
        projected = self._project(payload, checkpoint, info, cfg.enabled, rt, report)
        if projected is payload and not body.changed and body.source_bytes:
            # The client's own body goes on: its size is known (the fields beyond input, instructions and
            # tools are a rounding error), and serializing 1.5 MB again would cost more than parsing it.
            sent = body.source_bytes
        else:
            sent = _payload_bytes(projected, input_items(projected) or [])
        info.estimate = self._estimate(sent, info, sess, last_usage)
        failed_here = sess is not None and sess.failed_items == len(items)
        want = route.eligible and info.window is not None and not failed_here and _fresh(info) and (
            (cfg.enabled and over(info.estimate.tokens, info.window, cfg.threshold) and _grown(info))
            or (sess is not None and sess.force_compact and recover)
        )
        if want:
            payload = body.value
            info.client_items = items = input_items(payload) or []
            cp = await self._compact(flow, info, payload, "threshold", rt)
            projected = self._project(payload, cp, info, cfg.enabled, rt)
            sent = _payload_bytes(projected, input_items(projected) or [])
            info.estimate = self._estimate(sent, info, None, None)
        fit_budget: int | None = None
        by_bytes = _tokens(sent, info.estimate.ratio)  # the usage estimate may reflect a fitted retry
        if info.checkpoint is not None and over(max(info.estimate.tokens, by_bytes), info.window, cfg.threshold):
            # Still above the threshold with a checkpoint in effect (a compaction would not help, or just
            # did not): the bootstrap gives way (retained messages, then the fallback's excerpt).
            fitted = self._fit(projected, info, cfg.threshold * (info.window or 0))
            if fitted is not None:
                projected, fit_budget = fitted
                sent = _payload_bytes(projected, input_items(projected) or [])
                info.estimate = self._estimate(sent, info, None, None)
        info.hold = (recover and route.eligible
                     and over(info.estimate.tokens, info.window, HOLD_FRACTION))
        # The context stage (addons/context.py) applies the checkpoint in effect to the body: compaction only
        # decides, on the projection that stage will send (the same pure transform).
        cp_id = info.checkpoint.id if info.checkpoint else None
        # Coalesced: the session's newest row is all that counts (this process reads its memo, not the row). The
        # write waits for its batch: it closes over the count, never over the items (they would live until then).
        n_items = len(items)
        db.put_latest(("forwarded", key), lambda conn: store.record_forwarded(conn, key, cp_id, n_items, sent))
        if want:  # a compaction wrote more than record_forwarded does: read it back next time
            _memo(rt).forget(key)
        else:  # mirror exactly what record_forwarded writes, so the next request can skip the read
            _memo(rt).put(key, store.SessionRecord(
                store.LastRequest(cp_id, len(items), sent), False, sess.failed_items if sess is not None else None,
                info.compacted_items))
        st.compaction = info
        st.window = _decided(info, info.checkpoint is not None, fit_budget)  # made once; later steps derive
        debuglog.event("remote_compaction", outcome=info.outcome, estimate=info.estimate.tokens, window=info.window,
                       checkpoint=cp_id, items=len(items), stream=info.hold)

    def _project(self, payload: dict[str, Any], cp: Checkpoint | None, info: FlowInfo, enabled: bool,
                 rt: runtime.Runtime, report_divergence: bool = True) -> dict[str, Any]:
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
                self._event(rt, info, "projection", "diverged", None, cp.id)
            return payload
        info.checkpoint, info.replay_opaque = cp, replay and outcome in ("remote", "already")
        return projected

    @staticmethod
    def _estimate(sent_bytes: int, info: FlowInfo, sess: store.SessionRecord | None,
                  last_usage: usage.Usage | None) -> Estimate:
        snap = UsageSnapshot(last_usage.input_tokens, last_usage.output_tokens) if last_usage else None
        last: LastRequest | None = sess.last if sess is not None else None
        cp_id = info.checkpoint.id if info.checkpoint else None
        return estimate(sent_bytes, info.client_items, cp_id, snap, last)

    @staticmethod
    def _fit(payload: dict[str, Any], info: FlowInfo, budget_tokens: float) -> tuple[dict[str, Any], int] | None:
        """The projected payload with its bootstrap trimmed so the whole estimate is within
        `budget_tokens`, and the input-bytes budget that took; None when even the bare compaction item
        (or marker) and the tail do not fit."""
        cp = info.checkpoint
        if cp is None or info.outcome == "already":
            return None  # "already": the client sent the bootstrap itself; its own items are not ours to cut
        budget_bytes = int(budget_tokens / max(info.estimate.ratio, 0.01) * 4) - _payload_bytes(payload, [])
        fitted = fit_projection(payload, info.client_items[cp.boundary:], budget_bytes)
        return None if fitted is None else (fitted, budget_bytes)

    async def _learned_window(self, rt: runtime.Runtime, db: dbworker.DBWorker, model: str,
                              endpoint: str) -> int | None:
        cache = rt.services.compaction_windows
        k = (model, endpoint)
        if k not in cache:
            cache[k] = await db.run(lambda conn: store.learned_window(conn, model, endpoint))
        return cache[k]

    def _learn(self, rt: runtime.Runtime, info: FlowInfo, tokens: int) -> None:
        """The upstream answered context_length_exceeded at `tokens` (estimated): remember it per model
        and endpoint, in this process and in the compaction store."""
        model = info.fingerprint.model if info.fingerprint else str(info.payload.get("model") or "")
        endpoint = info.endpoint
        if not model or not endpoint or tokens <= 0:
            return
        cache = rt.services.compaction_windows
        old = cache.get((model, endpoint))
        cache[(model, endpoint)] = tokens if old is None else min(old, tokens)
        if info.window is None or tokens < info.window:
            info.window = tokens
        self._db(rt).submit(lambda conn: store.learn_window(conn, model, endpoint, tokens))
        debuglog.event("overflow_recovery", phase="window", outcome="learned", window=cache[(model, endpoint)])

    def _blocked(self, info: FlowInfo, rt: runtime.Runtime) -> str | None:
        # the one rule (proxy/compaction/eligibility.py), shared with the context stage's hard trigger
        return remote_blocked(rt.config.remote_compaction, info.route.eligible, info.fingerprint)

    async def _compact(self, flow: http.HTTPFlow, info: FlowInfo, request_payload: dict[str, Any], reason: str,
                       rt: runtime.Runtime) -> Checkpoint:
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
            fingerprint=info.fingerprint, target=info.target, remote_blocked=self._blocked(info, rt), reason=reason,
            notes=notes, journal_required=False)  # unjournaled, the checkpoint still serves this request
        deps = service.deps_of(rt, info.route, info.credentials_allowed, w.journal if w is not None else None)
        cp = await service.compact_and_open(deps, order)  # the one compaction path (proxy/windows/service.py)
        info.compacted, info.compacted_items = True, len(info.client_items)
        return cp

    def _event(self, rt: runtime.Runtime, info: FlowInfo, kind: str, outcome: str, reason: str | None,
               cp_id: str | None) -> None:
        key = info.session_key
        self._db(rt).submit(lambda conn: store.record_event(conn, key, kind, outcome, reason, cp_id))
        journal_link.record_event(info.windows, kind, {"outcome": outcome, "reason": reason, "checkpoint_id": cp_id})
        debuglog.event("remote_compaction", phase=kind, outcome=outcome, reason=reason, checkpoint=cp_id)
        if kind == "recovery":  # every outcome of an overflow recovery, made a compaction or not
            proxy_metrics().overflow_recovery(outcome)

    # ------------------------------------------------------------------ response
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        info = state_of(flow).compaction
        resp = flow.response
        if not isinstance(info, FlowInfo) or resp is None:
            return
        recoverable = self.rt.config.recovers_overflow() and info.route.eligible
        ctype = resp.headers.get("content-type", "").lower()
        if info.hold and resp.status_code == 200 and ctype.startswith("text/event-stream"):
            info.held_stream = resp.stream  # the tap's callable, fed once the answer is settled
            resp.stream = False  # buffer: the events are held until `response`
            state_of(flow).settling = Settling()
        elif recoverable and resp.status_code == 400 and "json" in ctype:
            state_of(flow).settling = Settling()  # maybe an overflow: the answer may still change

    async def response(self, flow: http.HTTPFlow) -> None:
        info = state_of(flow).compaction
        if not isinstance(info, FlowInfo) or flow.response is None:
            return
        rt = self.rt
        resp = flow.response
        streamed = bool(resp.stream) and info.held_stream is None
        code = None
        if not streamed:
            code = response_error_code(resp.status_code, resp.headers.get("content-type", ""),
                                       resp.get_content(strict=False) or b"")
        recovered = False
        if code == CODE and rt.config.recovers_overflow() and info.route.eligible:
            recovered = await self._recover(flow, info, rt)
        elif code is None and streamed:
            tap = state_of(flow).tap
            if isinstance(tap, ResponseTap) and tap.error_code == CODE:
                # Too late to recover (output may have reached the agent): compact on the next request.
                key = info.session_key
                _memo(rt).forget(key)
                self._db(rt).submit(lambda conn: store.mark_force_compact(conn, key))
                self._event(rt, info, "recovery", "missed", "streamed", None)
        if info.held_stream is not None and not recovered:
            self._release_held(flow, info)
        st = state_of(flow)
        if st.settling is not None:  # final now: the stages that read answers read this one
            settling, st.settling = st.settling, None
            settling.settled()
            await budget.committed(self._db(rt))  # what they recorded is committed before the answer ends

    def _release_held(self, flow: http.HTTPFlow, info: FlowInfo) -> None:
        """Feed the held answer to the tap that would have seen it streamed."""
        stream = info.held_stream
        raw = flow.response.raw_content if flow.response is not None else None
        if callable(stream) and raw is not None:
            stream(raw)
            stream(b"")

    async def _recover(self, flow: http.HTTPFlow, info: FlowInfo, rt: runtime.Runtime) -> bool:
        """Compact (at most once per agent request, and only with new agent items since the last
        compaction) and retry once with a body strictly smaller than the one that failed: at most
        RETRY_FRACTION of it, the bootstrap giving way until it fits. The failed size is also an upper
        bound of the upstream's real window: it is learned and remembered."""
        started = time.perf_counter()
        try:
            forwarded = orjson.loads(flow.request.get_content(strict=False) or b"")
        except orjson.JSONDecodeError:
            return False
        if not isinstance(forwarded, dict):
            return False
        failed_bytes = _payload_bytes(forwarded, input_items(forwarded) or [])
        self._learn(rt, info, _tokens(failed_bytes, info.estimate.ratio))
        decided = state_of(flow).window
        if decided is not None:  # the request's current decision: a later stage (context) may have compacted
            info.checkpoint, info.replay_opaque = decided.checkpoint, decided.replay_opaque
            info.outcome = decided.outcome
            info.compacted, info.compacted_items = decided.compacted, decided.compacted_items
        replay = info.replay_opaque
        if not info.compacted and _fresh(info):
            cp = await self._compact(flow, info, forwarded, "overflow", rt)
            replay = cp.strategy == "remote"
            info.outcome = cp.strategy  # the retry below is a projection of this new checkpoint
        elif info.checkpoint is not None:
            cp = info.checkpoint  # no second compaction: the checkpoint in effect is made to fit instead
        else:
            self._event(rt, info, "recovery", "skipped", "no_new_items", None)
            return False
        retry_payload = dict(forwarded)
        retry_payload["input"] = [*cp.record().bootstrap(replay), *info.client_items[cp.boundary:]]
        info.checkpoint, info.replay_opaque = cp, replay
        state_of(flow).window = _decided(info, True)  # derived: the retry goes out with this checkpoint
        budget = failed_bytes * RETRY_FRACTION
        if _payload_bytes(retry_payload, retry_payload["input"]) > budget:
            fitted = self._fit(retry_payload, info, _tokens(int(budget), info.estimate.ratio))
            if fitted is None:
                self._event(rt, info, "recovery", "not_smaller", cp.strategy, cp.id)
                return False  # nothing smaller to send: the agent gets the original error
            retry_payload = fitted[0]
        retry_bytes = _payload_bytes(retry_payload, retry_payload["input"])
        deps = service.deps_of(rt, info.route, info.credentials_allowed, state_of(flow).journal)
        new = await recovery.send_retry(deps, flow.request, retry_payload)
        code = None if new is None else response_error_code(
            new.status_code, new.headers.get("content-type", ""), new.get_content(strict=False) or b"")
        ok = new is not None and code is None
        if code == CODE:
            self._learn(rt, info, _tokens(retry_bytes, info.estimate.ratio))
        outcome = "recovered" if ok else "retry_failed"
        self._event(rt, info, "recovery", outcome, cp.strategy, cp.id)
        debuglog.event("overflow_recovery", outcome=outcome, strategy=cp.strategy, host=flow.request.host,
                       status=new.status_code if new is not None else None, bytes=retry_bytes,
                       ms=(time.perf_counter() - started) * 1000)
        if not ok or new is None:
            return False  # the agent gets the original upstream error unchanged
        # What the upstream really answered is the retry: the next estimate calibrates against it.
        key, n, cp_id = info.session_key, len(info.client_items), cp.id
        _memo(rt).forget(key)
        self._db(rt).put_latest(("forwarded", key),
                                lambda conn: store.record_forwarded(conn, key, cp_id, n, retry_bytes))
        flow.response = new
        recovery.retap(flow, new)
        return True


addons = [Compaction()]
