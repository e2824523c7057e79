"""Streams responses through chunk by chunk and taps Responses answers without changing a byte.

SSE answers of Responses requests get a `StreamTap` (decodes a copy of each chunk); other responses
are streamed untouched; JSON Responses answers are buffered and parsed once in `response`. The tap
(`state_of(flow).tap`, see proxy/host/flowstate.py) gives later addons the output items, usage and errors, and records
the
session's usage for `get_context_remaining`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import orjson
from mitmproxy import http

from addons._flow import session_of, weak_listener
from addons._stage import Stage
from proxy import dbworker
from proxy.app import runtime
from proxy.host import clientecho
from proxy.host.flowbody import is_compact, is_responses_create
from proxy.host.flowstate import state_of
from proxy.items.sse import ResponseTap, StreamTap, decompressor
from proxy.windows import budget, cache_stats

log = logging.getLogger("ctproxy.tap")
TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})


def _usage_wanted(config) -> bool:
    """Usage feeds get_context_remaining, the compaction estimate and web search's 128k check."""
    rc = config.remote_compaction
    return (config.context.enabled or rc.enabled or rc.recover_overflow
            or (config.web_search.enabled and config.web_search.backend != "off"))


def _tap_wanted(config) -> bool:
    """Someone reads answers: usage, the journal's output items, or compaction's overflow detection."""
    rc = config.remote_compaction
    return _usage_wanted(config) or config.history.enabled or rc.enabled or rc.recover_overflow


def _echo_stream(resp: http.Response, echo: clientecho.ClientEcho) -> clientecho.EchoStream | None:
    """The stream filter that gives the lifecycle events the client's request; a compressed stream is passed on
    decoded (None, and the answer untouched, for an encoding the tap cannot decode)."""
    encoding = resp.headers.get("content-encoding", "")
    try:
        decode = decompressor(encoding)
    except ValueError:
        log.warning("tap: a %s stream is passed on as it came (its lifecycle events show ctproxy's request)",
                    encoding)
        return None
    if decode is not None:
        del resp.headers["content-encoding"]
    resp.headers.pop("content-length", None)  # the events change size
    return clientecho.EchoStream(echo, decode)


def _restore_buffered(flow: http.HTTPFlow, echo: clientecho.ClientEcho) -> None:
    """A buffered answer (JSON, or a held or replayed stream) with the client's request in its Response objects."""
    resp = flow.response
    if resp is None or resp.raw_content is None:
        return
    ctype = resp.headers.get("content-type", "").lower()
    content = resp.get_content(strict=False) or b""
    if ctype.startswith("text/event-stream"):
        new = clientecho.restore_sse(content, echo)
        if new is not content:
            resp.content = new
    elif "json" in ctype and (new := clientecho.restore_json(content, echo)) is not None:
        resp.content = new


class Tap(Stage):
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        resp = flow.response
        if resp is None or resp.stream:
            return
        st = state_of(flow)
        ours = is_responses_create(flow) or is_compact(flow)
        tapped = ours and _tap_wanted(self.rt.config)
        if not tapped and (not ours or st.echo is None):
            # Not ours to read, or nobody reads it: pass it through as it arrives, without buffering.
            resp.stream = True
            return
        sse = resp.headers.get("content-type", "").lower().startswith("text/event-stream")
        encoding = resp.headers.get("content-encoding", "")
        rewrite = _echo_stream(resp, st.echo) if sse and st.echo is not None else None
        if not tapped:  # only the client's request to give back: a JSON answer is buffered, restored in `response`
            if rewrite is not None:
                resp.stream = rewrite
            return
        tap = ResponseTap()
        st.tap = tap
        if sse:
            resp.stream = StreamTap(tap, encoding) if rewrite is None else clientecho.EchoTap(tap, rewrite)
            tap.listeners.append(weak_listener(flow, self._on_stream_event))

    def _on_stream_event(self, flow: http.HTTPFlow, typ: str, _payload: dict) -> None:
        # Inside the stream callable, before the terminal chunk goes on to the client: the session's next
        # request will see this usage.
        tap = state_of(flow).tap
        if typ in TERMINAL_EVENTS and isinstance(tap, ResponseTap):
            try:
                if self._record_usage(flow, tap):
                    # The answer ends once this usage is committed (`response`): the commit starts now, while the
                    # last bytes are passed on, so that by then it is usually done and the end need not wait.
                    budget.commit_now(dbworker.shared(self.rt.services, self.rt.state.db_path))
            except Exception as exc:  # observing must never break the stream
                log.error("tap: usage not recorded (%s)", type(exc).__name__)

    def response(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        st = state_of(flow)
        if st.tap is None and st.echo is not None and flow.response is not None and not flow.response.stream:
            _restore_buffered(flow, st.echo)  # (nobody taps this answer, but it must show the client's request)
        if not self._read(flow):
            return None
        # the answer ends (its last bytes, mitmproxy's end of message) once its usage is committed; None when
        # it is already (its commit started at the terminal event)
        return dbworker.shared(self.rt.services, self.rt.state.db_path).settled()

    def _read(self, flow: http.HTTPFlow) -> bool:
        """Read the final answer and record its usage; whether usage was recorded for it."""
        st = state_of(flow)
        tap = st.tap
        if not isinstance(tap, ResponseTap) or flow.response is None:
            return False
        if st.settling is not None:  # the answer may still be replaced: read it once it is final
            st.settling.when_settled(lambda: self._read(flow))  # (the settling stage awaits the commit)
            return False
        stream = flow.response.stream
        ctype = flow.response.headers.get("content-type", "").lower()
        if isinstance(stream, StreamTap):
            stream.finish()
        elif ctype.startswith("text/event-stream") and flow.response.raw_content is not None:
            # A buffered stream (held by the compaction addon, or replayed): decode it whole.
            if st.echo is not None:
                _restore_buffered(flow, st.echo)
            tap = ResponseTap()
            replay = StreamTap(tap)
            st.tap = tap
            replay(flow.response.get_content(strict=False) or b"")
            replay(b"")
        elif flow.response.raw_content is not None and "json" in ctype:  # (read once above: a pass over the headers)
            try:
                body = orjson.loads(flow.response.get_content(strict=False) or b"")
            except (orjson.JSONDecodeError, ValueError):
                body = None
            if isinstance(body, dict):
                tap.on_json_response(body)
                if st.echo is not None and body.get("object") == "response" and clientecho.restore(body, st.echo):
                    flow.response.content = orjson.dumps(body)
        self._record_usage(flow, tap)
        return tap.usage_recorded

    def error(self, flow: http.HTTPFlow) -> None:
        tap = state_of(flow).tap
        if isinstance(tap, ResponseTap) and not tap.completed:
            tap.incomplete = True  # upstream broke off mid-stream; the client saw a disconnect

    def _record_usage(self, flow: http.HTTPFlow, tap: ResponseTap) -> bool:
        """Record the answer's usage once; whether this call recorded it."""
        if tap.usage_recorded or not tap.usage or not is_responses_create(flow):
            return False
        rt = self.rt
        if not _usage_wanted(rt.config):
            return False  # nobody reads usage: do not even resolve the session (that parses the request body)
        if state_of(flow).settling is not None:
            return False  # not final yet; `response` records it once the answer is settled
        ident = session_of(flow, rt.services.response_aliases)
        if ident is None:
            return False
        task, agent = ident.task, ident.agent
        rec = state_of(flow).agent_identity  # set by the journal when it knows (task, agent)
        if isinstance(rec, tuple) and len(rec) == 2:
            task, agent = rec
        counted = state_of(flow).context_usage  # a bridged turn: its last round's usage, not the sum
        used = dict(counted.usage) if counted is not None and counted.usage else dict(tap.usage)
        model, rid = tap.model or ident.model, tap.response_id
        tap.usage_recorded = True
        # Coalesced: only the session's newest usage matters, and a burst of answers shares one commit; the
        # `response` hook waits for that commit before the answer ends (read-your-writes).
        budget.record(rt.services, rt.state.db_path, ident.session_key, task, agent, model, used, rid)
        _count_cache(rt, flow, ident.session_key, task, agent, tap)
        return True

    def done(self) -> None:
        dbworker.close_shared(self.rt.services)


def _count_cache(rt: runtime.Runtime, flow: http.HTTPFlow, session_key: str, task: str | None, agent: str | None,
                 tap: ResponseTap) -> None:
    """The answer's prompt-cache figures, per session and window (proxy/windows/cache_stats.py, issue 47)."""
    seen = cache_stats.seen_of(tap.usage, tap.input_transformations)
    if seen is None:
        return
    mark = state_of(flow).request_mark
    window = getattr(getattr(getattr(mark, "state", None), "window", None), "window_id", None)
    key = getattr(mark, "session_key", None) or session_key  # the journal's key: what `ctproxy show` names
    cache_stats.STATS.observe(rt.services, rt.state.db_path, key, window or "", task, agent, seen)


addons = [Tap()]
