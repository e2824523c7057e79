"""One line per request at info level, the proxy's metrics, and the dashboard's live feed (issue 17).

The last stage of the chain: it reads what the others wrote into the flow's typed state
(`proxy/host/flowstate.FlowState`) once the answer is final and turns it into a `RequestRecord`
(`proxy/app/telemetry.py`): method, path (never the query), status, duration, time to first byte, bytes,
whether the answer streamed, model, session, and the stages applied (web_search, window:<strategy>,
compaction:<strategy>, held, body:<limit>). The record goes to the `ctproxy.requests` logger, to the
process's Prometheus metrics (`proxy/metrics.py`) and to the request feed the tool server relays.
Nothing in it can carry a header, a prompt, a tool argument or a result: values are categories, counts,
ids and timings, and strings pass `debuglog.safe_value`.

The answer's hook only schedules a snapshot (`SeenRequest`: references and numbers, read right after mitmproxy has
sent the answer and before the flow's state is released); records, metrics, feed and lines are made for every
pending snapshot at once, `FLUSH_SECONDS` later on the event loop. Measured inside `ctproxy up` (main-thread CPU, 10
KB requests one at a time): made one by one right after each answer, the same work cost ≈175 µs a request (the log
line alone ≈70 µs: code run once after the loop slept runs from cold caches), about a third of that in batches.

Options: `ctp_request_log` (the log line; `ctproxy up --quiet` turns it off) and `ctp_metrics` (metrics
and feed; `--no-metrics`). Loads alone: `mitmdump -s addons/requestlog.py` (the line then goes through
mitmproxy's own log).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from mitmproxy import ctx, http

from addons._stage import Stage
from proxy import debuglog, workerid
from proxy.app.telemetry import DIFF_BODY_MAX, Bodies, RequestFeed, RequestRecord, SeenRequest, request_feed
from proxy.bridge.server import agent_path
from proxy.host import rawheaders
from proxy.host.flowbody import ResponsesBody
from proxy.host.flowstate import FlowState, state_of
from proxy.items.sse import StreamTap
from proxy.metrics import Observed, ProxyMetrics, proxy_metrics, route_label
from proxy.session import SessionIdentity
from proxy.ws import agent_path as ws_agent_path

log = logging.getLogger("ctproxy.requests")

FLUSH_SECONDS = 0.25  # pending snapshots become records this long after the first one


class _Counted:
    """Counts the bytes of a stream mitmproxy passes through untouched (`stream = True`)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, chunk: bytes) -> bytes:
        self.n += len(chunk)
        return chunk


def _stream_bytes(stream: Any) -> int | None:
    if isinstance(stream, (_Counted, StreamTap)):
        return stream.n if isinstance(stream, _Counted) else stream.nbytes
    return None


def stages_of(st: FlowState) -> list[str]:
    """What the chain did to this request, read from the typed per-flow state (categories only)."""
    out: list[str] = []
    if st.web_search == "native":
        out.append("web_search")
    if st.bridge_offered:
        out.append("bridge")  # it offered tools, and runs the model's calls to them
    info = st.window
    if info is not None:
        cp = info.checkpoint
        if info.outcome == "diverged":
            out.append("window:diverged")
        elif cp is not None:  # the request went out with a checkpoint's bootstrap: the one it really carried
            out.append("window:fallback" if cp.strategy == "remote" and not info.replay_opaque
                       else f"window:{cp.strategy}")
        if info.compacted and cp is not None:
            out.append(f"compaction:{cp.strategy}:{cp.reason.split(':', 1)[0]}")
    if st.compaction is not None and st.compaction.hold:
        out.append("held")  # near the window: buffered for a possible overflow recovery (compaction's own)
    if st.body_limit:
        out.append(f"body:{st.body_limit}")
    return [s if s in _FIXED_STAGES or (isinstance(debuglog.safe_value(s), str) and s != "?") else "other"
            for s in out]


_FIXED_STAGES = frozenset({"web_search", "bridge", "window:diverged", "held"})  # no data in them: nothing to check


def _identity(st: FlowState) -> tuple[str | None, str | None, str | None]:
    ident = st.session
    if not isinstance(ident, SessionIdentity):
        return None, None, None
    task, agent = ident.task, ident.agent
    if isinstance(st.agent_identity, tuple) and len(st.agent_identity) == 2:
        task, agent = st.agent_identity
    return ident.session_key, task, agent


def _model(st: FlowState) -> str | None:
    tap = st.tap
    model = getattr(tap, "model", None)
    if not model and isinstance(st.body, ResponsesBody):
        model = st.body.view.get("model")
    return model if isinstance(model, str) else None


def _seen(flow: http.HTTPFlow, error: str | None) -> SeenRequest:
    req, resp = flow.request, flow.response
    st = state_of(flow)
    start = req.timestamp_start
    end = (resp.timestamp_end if resp is not None else None) or time.time()
    ttfb = (resp.timestamp_start - start) * 1000 if resp is not None and resp.timestamp_start else None
    sent = st.client_request if st.client_request is not None else req.raw_content
    raw = resp.raw_content if resp is not None else None
    status = resp.status_code if resp is not None and error is None else None
    ctype, length = (rawheaders.values(resp.headers.fields, b"content-type", b"content-length")
                     if resp is not None else ("", ""))
    return SeenRequest(req.method, req.path, start, end, ttfb, status, error, ctype,
                 resp.stream if resp is not None else None, len(raw) if raw is not None else None,
                 length, len(sent) if sent is not None else 0, _model(st), _identity(st), stages_of(st),
                 _compacted(st), transport=st.transport)


def _compacted(st: FlowState) -> tuple[str, str] | None:
    info = st.window
    if info is not None and info.compacted and info.checkpoint is not None:
        return info.checkpoint.strategy, info.checkpoint.reason.split(":", 1)[0]
    return None


def _str(value: Any) -> str | None:
    v = debuglog.safe_value(value)
    return v if isinstance(v, str) and v != "?" else None


def format_line(r: RequestRecord) -> str:
    parts = [r.method, r.path, str(r.status) if r.status is not None else (r.error or "error"), f"{r.ms:.0f}ms"]
    if r.ttfb_ms is not None:
        parts.append(f"ttfb={r.ttfb_ms:.0f}ms")
    parts.append("stream" if r.stream else "buffered")
    if r.model:
        parts.append(f"model={r.model}")
    parts.append(f"in={r.bytes_in}B")
    if r.bytes_out is not None:
        parts.append(f"out={r.bytes_out}B")
    parts.append("stages=" + (",".join(r.stages) or "none"))
    if r.transport != "http":
        parts.append(f"transport={r.transport}")
    if r.session:
        parts.append(f"session={r.session}")
    if r.worker is not None:
        parts.append(f"worker={r.worker}")
    return "ctproxy-request " + " ".join(parts)


def _bodies(flow: http.HTTPFlow, st: FlowState) -> Bodies | None:
    """The client's body and the forwarded one, for the dashboard's on-demand diff (small bodies only)."""
    client, forwarded = st.client_request, flow.request.raw_content
    if client is None or forwarded is None or len(client) > DIFF_BODY_MAX or len(forwarded) > DIFF_BODY_MAX:
        return None
    (encoding,) = rawheaders.values(flow.request.headers.fields, b"content-encoding")
    return Bodies(client, forwarded, encoding)


class RequestLog(Stage):
    def __init__(self) -> None:
        self.log_lines = True
        self.observe = True
        self._metrics: ProxyMetrics | None = None
        self._feed: RequestFeed | None = None
        self._pending: list[SeenRequest] = []

    def load(self, loader: Any) -> None:
        super().load(loader)
        loader.add_option("ctp_request_log", bool, True, "one info line per request (ctproxy up --quiet: off)")
        loader.add_option("ctp_metrics", bool, True, "Prometheus metrics and the dashboard's request feed")

    def configure(self, updated: set[str]) -> None:
        super().configure(updated)
        opts = ctx.options
        self.log_lines = bool(getattr(opts, "ctp_request_log", True))
        self.observe = bool(getattr(opts, "ctp_metrics", True))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        resp = flow.response
        if resp is None or not self.observe:
            return
        if resp.stream is True:
            resp.stream = _Counted()  # (the tap's StreamTap counts what passes through it itself)

    def response(self, flow: http.HTTPFlow) -> None:
        st = state_of(flow)
        if st.settling is not None:  # the answer may still be replaced: log the final one
            st.settling.when_settled(lambda: self._later(flow, None))
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (a direct call): now
            self._later(flow, None)
            return
        # Even the snapshot waits until mitmproxy has written the answer (it does, in the same task step, once
        # the hooks return): ≈20 µs off every answer's way. It still sees the flow's state: the chain releases
        # that with a callback scheduled after the hooks, so after this one (the loop runs them in order).
        loop.call_soon(self._later, flow, None)

    def error(self, flow: http.HTTPFlow) -> None:
        self._later(flow, "client_disconnected" if flow.response is not None else "upstream_failed")

    def _later(self, flow: http.HTTPFlow, error: str | None) -> None:
        """Once per flow: its snapshot joins the pending ones, made into records `FLUSH_SECONDS` from the first
        (mitmproxy sends a buffered answer once the `response` hooks return: none of it costs the client time)."""
        st = state_of(flow)
        if not (self.log_lines or self.observe) or st.logged_by is self:
            return
        st.logged_by = self  # (on the flow's state: a set of flows would cost a weak reference each)
        try:
            seen = _seen(flow, error)
            if self.observe:
                seen.bodies = _bodies(flow, st)
        except Exception as exc:  # observing must never break a request
            log.warning("request log: record failed (%s)", type(exc).__name__)
            return
        self._pending.append(seen)
        if len(self._pending) > 1:
            return  # a flush is scheduled
        try:
            asyncio.get_running_loop().call_later(FLUSH_SECONDS, self.flush)
        except RuntimeError:  # no event loop (a direct call): now
            self.flush()

    def flush(self) -> None:
        """Every pending snapshot made into its record: metrics, feed, line (in arrival order)."""
        pending, self._pending = self._pending, []
        for seen in pending:
            self._finish(seen)

    def done(self) -> None:
        self.flush()

    def _finish(self, seen: SeenRequest) -> None:
        try:
            record = self._build(seen)
        except Exception as exc:  # observing must never break a request
            log.warning("request log: record failed (%s)", type(exc).__name__)
            return
        if self.observe:
            if self._metrics is None:
                self._metrics, self._feed = proxy_metrics(), request_feed()
            self._observe(self._metrics, record, seen.compacted)
            assert self._feed is not None
            self._feed.publish(record, seen.bodies if record.route != "other" else None)
        if self.log_lines:
            log.info(format_line(record))

    def _build(self, seen: SeenRequest) -> RequestRecord:
        bytes_out: int | None = None
        stream = seen.ctype.lower().startswith("text/event-stream")
        counted = _stream_bytes(seen.stream)
        if counted is not None:
            bytes_out = counted
        elif seen.resp_raw is not None:
            bytes_out = seen.resp_raw
        elif seen.content_length.isdigit():
            bytes_out = int(seen.content_length)
        session, task, agent = seen.identity
        path = ws_agent_path(agent_path(seen.path)).split("?", 1)[0]  # never the bridge's or a socket's key
        feed = self._feed or request_feed()
        ttfb = seen.ttfb_ms
        return RequestRecord(
            id=feed.next_id(), at=seen.start, method=_str(seen.method) or "OTHER", path=_str(path[:200]) or "?",
            route=route_label(path), status=seen.status, ms=round((seen.end - seen.start) * 1000, 2),
            ttfb_ms=round(ttfb, 2) if ttfb is not None else None, bytes_in=seen.sent, bytes_out=bytes_out,
            stream=stream, model=_str(seen.model), session=_str(session), task=_str(task), agent=_str(agent),
            stages=seen.stages, error=seen.error, transport=seen.transport or "http", worker=workerid.index())

    @staticmethod
    def _observe(m: ProxyMetrics, r: RequestRecord, compacted: tuple[str, str] | None) -> None:
        m.observe_request(Observed(route=r.route, method=r.method, status=r.status, seconds=r.ms / 1000,
                                   ttfb_seconds=r.ttfb_ms / 1000 if r.ttfb_ms is not None else None,
                                   bytes_in=r.bytes_in, bytes_out=r.bytes_out))
        if compacted is not None:
            m.compaction(*compacted)  # (overflow recoveries: the compaction stage counts)


addons = [RequestLog()]
