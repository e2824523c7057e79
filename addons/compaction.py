"""Remote compaction v2 with a readable fallback, and overflow recovery (seed 004 §5.2, DESIGN §3.3).

request: reads the flow into plain values and asks the window feature for the request's decision
(`proxy/windows/decide.py`: the checkpoint in effect, the estimate, a compaction above the threshold, the hold
for a possible overflow). The context stage (addons/context.py) then applies the window to the body; this stage
never writes the body.

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

import logging
import os

from mitmproxy import http

from addons._flow import credentials_allowed, header_map, header_pairs, is_reverse, route_of, session_of
from addons._stage import Stage
from proxy import dbworker, debuglog, routes
from proxy.app import runtime
from proxy.host.flowbody import responses_body
from proxy.host.flowstate import Settling, retap, state_of
from proxy.items.sse import ResponseTap
from proxy.windows import budget, recovery
from proxy.windows.budget import usage_memo
from proxy.windows.decide import DecisionRequest, decide
from proxy.windows.remote.flowinfo import FlowInfo
from proxy.windows.remote.overflow import CODE, response_error_code

log = logging.getLogger("ctproxy.compaction")

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

    @staticmethod
    def _db(rt: runtime.Runtime) -> dbworker.DBWorker:
        return dbworker.shared(rt.services, rt.state.db_path)

    # ------------------------------------------------------------------ request
    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        rt = self.rt
        if not rt.config.remote_compaction.enabled and not rt.config.recovers_overflow():
            return  # nothing to project or hold: the body need not even be parsed
        body = responses_body(flow)
        if body is None:
            return
        debuglog.set_enabled(rt.config.debug)
        st = state_of(flow)
        route = route_of(flow, rt.upstream.trusted)
        req = flow.request
        decided = await decide(rt, DecisionRequest(
            body=body, session=lambda: session_of(flow, rt.services.response_aliases), route=route,
            credentials_allowed=lambda: credentials_allowed(flow, route),
            gateway_key=lambda: routes.gateway_key(route, is_reverse(flow), header_pairs(flow), os.environ),
            headers=header_map(flow),
            identity_headers=st.identity_headers, journal=st.journal, mark=st.journal_mark,
            stored_usage=usage_memo(st), flow_id=flow.id, scheme=req.scheme, host=req.host, port=req.port,
            path=req.path))
        if decided is not None:
            st.compaction, st.window = decided.info, decided.window

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
