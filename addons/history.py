"""Journals every Responses exchange: the client's new input items and the model's output items.

`request`: resolves the task/agent/session (joining a task named by `x-ctp-task`; an unknown task
is answered here with a 400 and never forwarded), snapshots the input and leaves a `RequestMark` in
`state_of(flow).journal_mark`; the journal aligns it with the session's branch when its writer
next drains (rung by a loop timer one interval later, or at the answer's terminal event while the session's
registration is not committed yet), or first when the mark's ids or the session are read
(proxy/journal/backlog.py).
The answer is handed over when the stream's terminal event passes through the tap (before its bytes
reach the client), or in `response` / `error` otherwise: its response id resolves to the session at
once, and its items join the branch before the session's next request is aligned. Nothing here
waits for the database, and no hashing or alignment runs on the request path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any

import orjson
from mitmproxy import http

from addons._flow import header_map, weak_listener
from addons._stage import Stage
from proxy.app import runtime
from proxy.host.flowbody import responses_body
from proxy.host.flowstate import state_of
from proxy.items.sse import ResponseTap, SSEDecoder
from proxy.journal import JoinError, Journal, RequestMark, journal_for
from proxy.session import SessionIdentity, minted_for, resolve_session
from proxy.windows.budget import turn_cost

log = logging.getLogger("ctproxy.history")

_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def journal(rt: runtime.Runtime) -> Journal | None:
    """The process's journal when history is enabled; also publishes the response aliases."""
    if not rt.config.enabled("history"):
        return None
    j = rt.services.journal
    if j is None:
        j = rt.services.journal = journal_for(rt.state, rt.config.history.cache_mb << 20, rt.state_store().journal())
    if rt.services.response_aliases is None:
        rt.services.response_aliases = j.aliases
    return j


def mark_of(flow: http.HTTPFlow) -> RequestMark | None:
    mark = state_of(flow).request_mark  # (after a checkpoint turn, the mark taken again with its write)
    return mark if isinstance(mark, RequestMark) else None


def _identity(flow: http.HTTPFlow, payload: dict[str, Any], j: Journal) -> tuple[SessionIdentity, dict[str, str]]:
    """The request's session identity, and its headers (lower-case names, x-ctp-* as the client sent them)."""
    st = state_of(flow)
    headers = header_map(flow)  # one pass over the raw fields; Headers.items() is quadratic
    ours = [name for name in headers if name.startswith("x-ctp-")]
    if ours:
        # Loaded without the session addon (which keeps them in the flow state and strips them): the
        # x-ctp-* headers are ours and never go upstream.
        if not st.identity_headers:
            st.identity_headers = {name: headers[name] for name in ours}
        for name in ours:
            del flow.request.headers[name]
    headers = {**headers, **st.identity_headers}  # (a new dict: header_map's is shared)
    if isinstance(st.session, SessionIdentity):
        return st.session, headers
    ident = resolve_session(headers, payload, j.aliases, fresh=flow.id)
    st.session = ident
    return ident, headers


def _refuse(flow: http.HTTPFlow, err: JoinError) -> None:
    flow.response = http.Response.make(err.status, orjson.dumps(err.body()),
                                       {"content-type": "application/json"})


def _tap_from_body(flow: http.HTTPFlow) -> ResponseTap | None:
    """Without the tap addon: read the buffered body (JSON or SSE) once."""
    resp = flow.response
    if resp is None or resp.raw_content is None:
        return None
    tap = ResponseTap()
    ctype = resp.headers.get("content-type", "").lower()
    try:
        content = resp.get_content(strict=False) or b""
        if ctype.startswith("text/event-stream"):
            dec = SSEDecoder()
            for ev in dec.feed(content) + dec.close():
                if ev.data and ev.data != "[DONE]":
                    payload = orjson.loads(ev.data)
                    if isinstance(payload, dict):
                        tap.on_event(payload)
            if not tap.completed:
                tap.incomplete = True
        elif "json" in ctype:
            body = orjson.loads(content)
            if isinstance(body, dict):
                tap.on_json_response(body)
    except (ValueError, orjson.JSONDecodeError):
        return None
    return tap


class History(Stage):
    _journal: Journal | bool | None = False  # False: not looked up since the runtime was (re)bound

    def bound(self, rt: runtime.Runtime) -> None:
        self._journal = False

    def unbind(self) -> None:
        super().unbind()
        self._journal = False

    def _current(self) -> Journal | None:
        if self._journal is False:
            self._journal = journal(self.rt)
        return self._journal  # type: ignore[return-value]

    def running(self) -> None:
        try:
            self._current()  # publish the aliases before the first request is resolved
        except Exception:
            log.warning("history: the journal could not be opened")

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        j = self._current()
        if j is None:
            return  # history is off: the body need not even be parsed
        body = responses_body(flow)
        if body is None:
            return
        payload = body.view  # identity and the journal read a big input lazily: its first items, and its bytes
        ident, headers = _identity(flow, payload, j)
        try:
            key, task_id, address = j.resolve(ident, headers, payload)
        except JoinError as err:
            _refuse(flow, err)
            return
        raw = body.client_input() if body.is_client_input(payload.get("input")) else None  # (not copied here)
        try:
            mark = j.begin_request(key, task_id, address, ident.source, payload, raw,  # aligned off the request path
                                   minted=minted_for(key, flow.id))
        except Exception as exc:  # the journal is a record: it never fails a request
            log.error("history: request not journaled (%s)", type(exc).__name__)
            return
        st = state_of(flow)
        st.journal_mark = mark
        st.journal = j  # the response side needs no runtime lookup (it is not free)
        st.agent_identity = (task_id, address)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        mark = mark_of(flow)
        tap = state_of(flow).tap
        if mark is None or not isinstance(tap, ResponseTap):
            return

        tap.listeners.append(weak_listener(flow, self._on_stream_event))

    def _on_stream_event(self, flow: http.HTTPFlow, typ: str, _payload: dict[str, Any]) -> None:
        # Runs inside the stream tap: it must never raise, or the tap would stop observing.
        tap = state_of(flow).tap
        if typ in _TERMINAL and isinstance(tap, ResponseTap):
            try:
                self._finish(flow, tap)
            except Exception as exc:
                log.error("history: response not journaled (%s)", type(exc).__name__)

    def response(self, flow: http.HTTPFlow) -> Awaitable[bool] | None:
        st = state_of(flow)
        if st.settling is not None:  # the answer may still be replaced: journal it once it is final
            st.settling.when_settled(lambda: self._answered(flow))
            return None
        self._answered(flow)
        # Read-your-writes: once the proxy has answered a session's first request, every tool and CLI call
        # (other processes) sees its task, agent and session; the answer ends once they are committed.
        mark, j = mark_of(flow), st.journal
        if mark is None or not isinstance(j, Journal) or mark.state is None:
            return None
        ev = mark.state.registered
        if ev is None:
            return None
        if ev.is_set():  # committed already (the writer drained while the answer streamed): no thread hop
            if mark.state.registered is ev:
                mark.state.registered = None
            return None
        return asyncio.to_thread(j.wait_registered, mark.state)

    def _answered(self, flow: http.HTTPFlow) -> None:
        if mark_of(flow) is not None:
            tap = state_of(flow).tap
            self._finish(flow, tap if isinstance(tap, ResponseTap) else _tap_from_body(flow))

    def error(self, flow: http.HTTPFlow) -> None:
        if mark_of(flow) is not None:
            tap = state_of(flow).tap
            self._finish(flow, tap if isinstance(tap, ResponseTap) else None, broken=True)

    def _finish(self, flow: http.HTTPFlow, tap: ResponseTap | None, broken: bool = False) -> None:
        mark = mark_of(flow)
        if mark is None or mark.response_done:
            return
        j = state_of(flow).journal
        if not isinstance(j, Journal):
            return
        try:
            if tap is None:
                j.end_response(mark, [], response_id=None, model=None, status="failed", usage=None,
                               error={"code": "no_response"} if broken else None, incomplete=True)
                return
            j.end_response(mark, tap.items, response_id=tap.response_id, model=tap.model, status=tap.status,
                           usage=turn_cost(tap.usage, state_of(flow).context_usage), error=tap.error,
                           incomplete=broken or tap.incomplete or not tap.completed)
        except Exception as exc:
            log.error("history: response not journaled (%s)", type(exc).__name__)

    def done(self) -> None:
        if self._rt is None:
            return  # never bound: no journal was opened
        j = self._rt.services.journal
        if isinstance(j, Journal) and not j.flush(timeout=30):
            log.error("history: the journal did not flush within 30 s")


addons = [History()]
