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
import os
import sqlite3
from typing import Any

from mitmproxy import http

from addons._flow import credentials_allowed, header_map, header_pairs, is_reverse, route_of, session_of
from addons._stage import Stage
from proxy import dbworker, debuglog, routes, usage
from proxy.app import runtime
from proxy.host.flowbody import responses_body
from proxy.host.flowstate import Settling, retap, state_of
from proxy.items.inputs import client_compacts, input_items
from proxy.items.sse import ResponseTap
from proxy.session import minted_for
from proxy.windows import budget, compacting, recovery, service, sizing
from proxy.windows.budget import usage_memo
from proxy.windows.remote import journal_link, store
from proxy.windows.remote.bookkeeping import records_on, shared_records
from proxy.windows.remote.decision import HOLD_FRACTION, Estimate, over
from proxy.windows.remote.fingerprint import fingerprint_of, load_key, normalise_endpoint
from proxy.windows.remote.flowinfo import FlowInfo
from proxy.windows.remote.overflow import CODE, response_error_code
from proxy.windows.remote.remote import compaction_target

log = logging.getLogger("ctproxy.compaction")

def _stateful(payload: dict[str, Any]) -> bool:
    return bool(payload.get("previous_response_id")) or payload.get("conversation") is not None


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
        route = route_of(flow, rt.upstream.trusted)
        db = self._db(rt)
        key = ident.session_key
        sess = _memo(rt).get(key)
        st = state_of(flow)
        memo = usage_memo(st)  # the stored usage is read once for the request, whichever stage asks first
        minted = minted_for(key, flow.id)  # a session this request opens: nothing was recorded for it anywhere
        if minted:
            memo.setdefault(key, None)
        if sess is not None or minted:  # no database round trip: this process wrote the session's last state
            last_usage = rt.services.usage.get(key, memo)
        else:
            records = shared_records(rt.state_store())  # the store's compaction records (None: embedded, on conn)
            cache = rt.services.usage
            sess, last_usage = await db.run(lambda conn: _snapshot(records, conn, key, cache, memo))
            last_usage = usage.newest(last_usage, cache.get(key, memo))
        headers = header_map(flow)
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
        learned = await compacting.learned_window(rt, db, model, endpoint) if route.eligible and model else None
        window = budget.effective_window(model, rt.config.model_windows, learned)  # the one window every reader reads
        info = FlowInfo(session_key=key, payload=payload, client_items=items, checkpoint=None, replay_opaque=False,
                        window=window, estimate=Estimate(0, "bytes", 1.0), make_fingerprint=make_fp, route=route,
                        credentials_allowed=credentials_allowed(flow, route), hold=False, mark=mark,
                        compacted_items=sess.compacted_items if sess is not None else None, endpoint=endpoint,
                        windows=windows)

        if route.kind is not None:
            gateway = routes.gateway_key(route, is_reverse(flow), header_pairs(flow), os.environ)
            info.make_target = functools.partial(compaction_target, route.kind, req.scheme, req.host, req.port,
                                                 req.path, headers, info.credentials_allowed, gateway)
        # A divergence is reported once: when the previous request still used the checkpoint.
        report = sess is None or checkpoint is None or sess.last.checkpoint_id == checkpoint.id
        projected = compacting.project(rt, payload, checkpoint, info, cfg.enabled, report)
        if projected is payload and not body.changed and body.source_bytes:
            # The client's own body goes on: its size is known (the fields beyond input, instructions and
            # tools are a rounding error), and serializing 1.5 MB again would cost more than parsing it.
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
        # A checkpoint in effect is replayed as it was stored, never refitted to this request (issue 47: the
        # bootstrap is built once, sized when the window opened; a refit edited the window's prefix every turn).
        fit_budget: int | None = None
        info.hold = (recover and route.eligible
                     and over(info.estimate.tokens, info.window, HOLD_FRACTION))
        # The context stage (addons/context.py) applies the checkpoint in effect to the body: compaction only
        # decides, on the projection that stage will send (the same pure transform).
        cp_id = info.checkpoint.id if info.checkpoint else None
        compacting.record_forwarded(rt, info, sess, len(items), sent, compacted=want)
        st.compaction = info
        st.window = sizing.decided(info, info.checkpoint is not None, fit_budget)  # made once; later steps derive
        debuglog.event("remote_compaction", outcome=info.outcome, estimate=info.estimate.tokens, window=info.window,
                       checkpoint=cp_id, items=len(items), stream=info.hold)

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
            if recovery.ran_bridged_calls(rt, flow.request.path):  # sent again, its calls would run twice: never
                recovery.missed(rt, info, "bridged_calls_ran")
            else:
                new = await recovery.recover(rt, flow.request, state_of(flow), info)
                if new is not None:  # the retry's answer is the agent's
                    flow.response = new
                    retap(flow, new)
                    recovered = True
        elif code is None and streamed:
            tap = state_of(flow).tap
            if isinstance(tap, ResponseTap) and tap.error_code == CODE:
                recovery.missed(rt, info)  # too late to recover: compact on the next request
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


addons = [Compaction()]
