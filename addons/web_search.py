"""Adds the hosted `web_search` tool to Responses requests on official routes (seed 004 §5.1).

Native only: with backend `auto` or `native` and an official (or trusted) route, the request gets
`{"type": "web_search"}` unless the client already has a web search tool (in `tools` or a leading
`additional_tools` item), and `web_search_call.action.sources` in `include`. Skipped (and recorded why,
`proxy.transforms.web_search.decide_native`) when the client says `x-ctp-web-search: off` (a header that never
goes upstream; a value other than off/on is a 400), when the session's last input was above the hosted
tool's 128k limit, when `tool_choice` is anything but `auto` (the injection never changes what it means),
when the client has a tool of its own named `web_search` (a conflict: the request is left alone), and, with
backend `auto`, when the request already offers the sidecar `openai_web_search` (also inside a namespace:
one search path per turn). Loads alone: `mitmdump -s addons/web_search.py`.
"""

from __future__ import annotations

import sqlite3

from mitmproxy import http

from addons._flow import route_of, session_of
from addons._stage import Stage
from proxy import dbworker, debuglog, usage
from proxy.app import runtime
from proxy.errors import ProxyError
from proxy.host.flowbody import commit_if_alone, responses_body
from proxy.host.flowstate import state_of
from proxy.session import minted_for
from proxy.transforms.web_search import (
    SWITCH_HEADER,
    SWITCH_VALUES,
    WebSearchSettings,
    decide_native,
    inject_web_search,
)
from proxy.windows.budget import usage_memo


def client_switch(flow: http.HTTPFlow) -> str | None:
    """The client's `x-ctp-web-search`, lower-cased (kept by the session stage with the other x-ctp-*
    headers, which never go upstream; alone, read and taken off the request here)."""
    st = state_of(flow)
    value = (st.identity_headers or {}).get(SWITCH_HEADER)
    if value is None and SWITCH_HEADER in flow.request.headers:
        value = flow.request.headers[SWITCH_HEADER]
        del flow.request.headers[SWITCH_HEADER]
    return value.strip().lower() if isinstance(value, str) else None


def _worker(rt: runtime.Runtime) -> dbworker.DBWorker:
    return dbworker.shared(rt.services, rt.state.db_path)


class WebSearch(Stage):
    async def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        rt = self.rt
        cfg = rt.config.web_search
        if not cfg.enabled or cfg.backend == "off":
            return  # the body need not even be parsed
        body = responses_body(flow)
        if body is None:
            return
        debuglog.set_enabled(rt.config.debug)
        switch = client_switch(flow)
        if switch is not None and switch not in SWITCH_VALUES:
            err = ProxyError(400, "invalid_request_error", "invalid_web_search_switch",
                             f"{SWITCH_HEADER} must be 'off' or 'on' (ctproxy's per-request web search switch)")
            flow.response = http.Response.make(err.status, err.body(), err.headers())
            return
        route = route_of(flow, rt.upstream.trusted)
        last_input = None
        if cfg.enabled and cfg.backend in ("auto", "native") and route.eligible:
            ident = session_of(flow, rt.services.response_aliases)
            if ident is not None:
                key = ident.session_key
                memo = usage_memo(state_of(flow))  # (compaction read the stored usage for this request already)
                if minted_for(key, flow.id):
                    memo.setdefault(key, None)  # a session this request opens: no usage anywhere yet
                cached = rt.services.usage.get(key, memo)
                if cached is not None:  # this process saw the session's last answer: no database trip
                    last_input = cached.input_tokens
                elif key in memo:  # read for this request (or none to read): no second round trip
                    last_input = memo[key].input_tokens if memo[key] is not None else None
                else:
                    last_input = await _worker(rt).run(lambda conn: _last_input(conn, key))
        # only `tools`, `tool_choice`, `include` and leading `additional_tools` items are read: a big input is
        # not built
        payload = body.view
        decision = decide_native(cfg, route.eligible, last_input, payload, switch)
        state_of(flow).web_search = decision.reason
        if decision.apply:
            body.replace(inject_web_search(payload, WebSearchSettings.from_config(cfg)))
        debuglog.event("web_search", outcome="injected" if decision.apply else "skipped", reason=decision.reason,
                       route=route.kind, host=flow.request.host, tokens=last_input)
        commit_if_alone(flow)

    def done(self) -> None:
        if self._rt is not None:  # never bound: nothing was opened
            dbworker.close_shared(self._rt.services)


def _last_input(conn: sqlite3.Connection, session_key: str) -> int | None:
    last = usage.last_usage_for_session(conn, session_key)
    return last.input_tokens if last is not None else None


addons = [WebSearch()]
