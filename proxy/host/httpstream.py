"""What ctproxy adds to mitmproxy's HTTP stream: JSON errors and upstream timeouts.

mitmproxy answers an upstream it cannot reach (and other failures of its own) with an HTML page that
names the address, has no connect timeout (the OS gives up after about two minutes) and waits for a
silent upstream until `tcp_timeout` (600 s, counted on the whole client connection, then it drops the
client without a word). None of this is reachable from an addon: the error page is written by the
HTTP layer after the `error` hook returned, and a stream callable is only called when bytes arrive.
So ctproxy wraps `HttpStream._handle_event`, the generator mitmproxy drives once per event of one
request, and reads and rewrites the commands it yields:

- `SendHttp(ResponseProtocolError)` to the client before any response byte went out becomes an
  OpenAI-style JSON error (`proxy/errors.py`) with the matching status (502, 504, 413, 400), on
  HTTP/1 and HTTP/2 alike. After the response started, mitmproxy's behaviour is kept (the client
  sees the upstream's failure as a disconnect), except for ctproxy's own timeouts, see below.
- `GetHttpConnection` (a connection is needed) starts the **connect timer**
  (`timeouts.connect_seconds`, TCP + TLS). When it expires the connection attempt is cancelled;
  the agent gets a 504 `upstream_connect_timeout`.
- `RequestEndOfMessage` to the upstream (the request has left) starts the **idle timer**
  (`timeouts.stream_idle_seconds`): every response event from the upstream (headers, each body chunk,
  trailers) counts as activity, buffered or streamed; time spent in ctproxy's own hooks does not count
  (as mitmproxy's own watchdog). When it expires the upstream connection is closed. Before any
  response byte reached the agent: a 504 `upstream_idle_timeout` JSON error. While an SSE answer is
  streaming: an `error` event (`code: upstream_idle_timeout`, the next `sequence_number`), then the
  stream ends cleanly. A compressed or non-SSE body that already started cannot take an event: the
  agent sees the connection close.
- `DropStream` (the request is over, however it ended) cancels both timers, so a finished flow is
  never kept alive by a timer.

One timer per waiting request, rescheduled only when it expires (activity only stores a time).
With an HTTP/2 upstream the idle timeout closes the whole upstream connection, so other requests
multiplexed on it fail too (HTTP/2 upstreams happen only in regular mode with an HTTP/2 client).

`_http1.make_error_response` (mitmproxy's HTML for requests it cannot even parse, where no stream
exists) is replaced by the JSON form as well. `install()` is idempotent; `addons/routing.py` and the
embedded master call it, so `ctproxy up` and `mitmdump -s addons/all.py` behave the same.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from proxy import errors

log = logging.getLogger("ctproxy.upstream")

DEFAULT_CONNECT_SECONDS = 15.0
DEFAULT_IDLE_SECONDS = 300.0
_RECHECK_SECONDS = 1.0  # a connection still queued behind mitmproxy's per-address limit is looked at again

_installed = False
_original_handle_event: Any = None
_original_make_error_response: Any = None


def install() -> bool:
    """Wrap mitmproxy's HttpStream once per process. False when this mitmproxy lacks what we wrap
    (then mitmproxy's own behaviour stays, and a warning says so)."""
    global _installed, _original_handle_event, _original_make_error_response
    if _installed:
        return True
    try:
        from mitmproxy.proxy.layers import http as layers_http
        from mitmproxy.proxy.layers.http import _http1

        stream_cls = layers_http.HttpStream
        original = stream_cls._handle_event
        original_page = _http1.make_error_response
        _bind(layers_http)
    except (ImportError, AttributeError) as exc:  # a mitmproxy whose internals moved
        log.warning("ctproxy: JSON errors and upstream timeouts unavailable with this mitmproxy (%s)", exc)
        return False
    _original_handle_event, _original_make_error_response = original, original_page
    stream_cls._handle_event = _handle_event
    _http1.make_error_response = _json_error_page
    _installed = True
    return True


def uninstall() -> None:
    """Restore mitmproxy's own behaviour (tests)."""
    global _installed
    if not _installed:
        return
    from mitmproxy.proxy.layers import http as layers_http
    from mitmproxy.proxy.layers.http import _http1

    layers_http.HttpStream._handle_event = _original_handle_event
    _http1.make_error_response = _original_make_error_response
    _installed = False


# mitmproxy names, bound at install (imported lazily so `proxy` stays importable without them).
SendHttp: Any = None
DropStream: Any = None
GetHttpConnection: Any = None
StartHook: Any = None
Server: Any = None
ErrorCode: Any = None
ResponseHeaders: Any = None
ResponseData: Any = None
ResponseTrailers: Any = None
ResponseEndOfMessage: Any = None
ResponseProtocolError: Any = None
RequestEndOfMessage: Any = None
_PROGRESS: tuple = ()


def _bind(layers_http: Any) -> None:
    global SendHttp, DropStream, GetHttpConnection, StartHook, Server, ErrorCode, ResponseHeaders, ResponseData
    global ResponseTrailers, ResponseEndOfMessage, ResponseProtocolError, RequestEndOfMessage, _PROGRESS
    from mitmproxy.connection import Server as _Server
    from mitmproxy.proxy.commands import StartHook as _StartHook
    from mitmproxy.proxy.layers.http import _events as ev

    SendHttp, DropStream = layers_http.SendHttp, layers_http.DropStream
    GetHttpConnection = layers_http.GetHttpConnection
    StartHook, Server, ErrorCode = _StartHook, _Server, ev.ErrorCode
    ResponseHeaders, ResponseData, ResponseTrailers = ev.ResponseHeaders, ev.ResponseData, ev.ResponseTrailers
    ResponseEndOfMessage, ResponseProtocolError = ev.ResponseEndOfMessage, ev.ResponseProtocolError
    RequestEndOfMessage = ev.RequestEndOfMessage
    _PROGRESS = (ResponseHeaders, ResponseData, ResponseTrailers)


_timeouts: tuple[float | None, float | None] = (DEFAULT_CONNECT_SECONDS, DEFAULT_IDLE_SECONDS)


def set_timeouts(connect_seconds: float | None, stream_idle_seconds: float | None) -> None:
    """The `timeouts.*` config, pushed by the stages when they take their runtime (addons/_stage.py)."""
    global _timeouts
    _timeouts = (connect_seconds, stream_idle_seconds)


def _settings() -> tuple[float | None, float | None]:
    return _timeouts


class _Watch:
    """One request's timers and what the agent has been sent so far."""

    __slots__ = ("connect_seconds", "connect_timer", "count_frames", "error_sent", "fired", "frames", "headers_sent",
                 "idle", "in_hook", "last", "loop", "stream_ref", "timed_out", "timer")

    def __init__(self, stream: Any):
        self.stream_ref = weakref.ref(stream)  # a timer never keeps a request (and its bodies) alive
        self.loop: asyncio.AbstractEventLoop | None = None
        self.idle: float | None = None  # set while the idle timer is armed
        self.last = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.in_hook = False
        self.connect_timer: asyncio.TimerHandle | None = None
        self.connect_seconds: float | None = None
        self.timed_out: str | None = None  # "connect" | "idle"
        self.fired = 0.0  # the timeout that expired, in seconds
        self.headers_sent = False
        self.error_sent = False
        self.frames = 0  # SSE frames sent, counted only when no tap counts them
        self.count_frames = False

    def disarm(self) -> None:
        self.idle = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def stop_connect(self) -> None:
        self.connect_seconds = None
        if self.connect_timer is not None:
            self.connect_timer.cancel()
            self.connect_timer = None


def _handle_event(self: Any, event: Any):
    """`HttpStream._handle_event`, watched (see the module docstring)."""
    w = self.__dict__.get("_ctp_watch")
    if w is None:
        w = self._ctp_watch = _Watch(self)
    kind = type(event)
    if kind in _PROGRESS:
        if w.idle is not None:
            w.last = w.loop.time()  # type: ignore[union-attr]
        if kind is ResponseData and w.headers_sent and not w.count_frames:
            # A chunk of an answer already streaming (most events of a stream): mitmproxy only passes it on to
            # the client (`SendHttp(ResponseData)`), which nothing below changes without a frame count, so its
            # commands go straight through, not one by one through the loop below.
            return (yield from _original_handle_event(self, event))
    elif kind is ResponseEndOfMessage:
        w.disarm()
    elif kind is ResponseProtocolError:
        w.disarm()
        if w.timed_out is not None:  # our timeout closed the upstream: say so in flow.error too
            event = ResponseProtocolError(event.stream_id, _timeout_message(w), event.code)
    gen = _original_handle_event(self, event)
    send = None
    while True:
        try:
            cmd = gen.send(send)
        except StopIteration:
            return
        ctype = type(cmd)
        if ctype is SendHttp:
            out = cmd.event
            otype = type(out)
            to_client = cmd.connection is self.context.client
            if otype is ResponseProtocolError and to_client:
                try:
                    replacement = _replacement(self, w, out)
                except Exception:  # ours must never break mitmproxy's stream: its own behaviour then
                    log.exception("ctproxy: could not answer a proxy error in JSON")
                    replacement = None
                if replacement is not None:
                    yield from replacement  # plain sends: nothing comes back
                    send = None
                    continue
            elif to_client and otype is ResponseData:
                if w.count_frames:
                    w.frames += out.data.count(b"\n\n")
            elif to_client and otype is ResponseHeaders:
                w.headers_sent = True
                w.count_frames = w.idle is not None and _needs_frame_count(self)
            elif otype is RequestEndOfMessage and not to_client:
                _arm_idle(w)
            elif otype is ResponseEndOfMessage and to_client and w.timed_out == "idle" and not w.error_sent:
                # A read-until-close upstream: closing it ended the body normally; still tell the agent.
                extra = _stream_error(self, w)
                if extra is not None:
                    yield SendHttp(ResponseData(out.stream_id, extra), cmd.connection)
        elif ctype is GetHttpConnection:
            _start_connect(w, cmd)
            send = yield cmd
            w.stop_connect()
            continue
        elif ctype is DropStream:
            w.disarm()
            w.stop_connect()
        elif cmd.blocking is True and isinstance(cmd, StartHook):
            w.in_hook = True  # our own hooks' time is not the upstream's silence
            send = yield cmd
            w.in_hook = False
            if w.idle is not None:
                w.last = w.loop.time()  # type: ignore[union-attr]
            continue
        send = yield cmd


# ---- timers -----------------------------------------------------------------------------------------

def _arm_idle(w: _Watch) -> None:
    try:
        _arm_idle_timer(w)
    except Exception:
        log.exception("ctproxy: the idle timeout could not be armed")


def _arm_idle_timer(w: _Watch) -> None:
    _, idle = _settings()
    if idle is None or idle <= 0:
        return
    loop = w.loop or asyncio.get_running_loop()
    w.loop = loop
    w.disarm()
    w.idle = idle
    w.last = loop.time()
    w.timer = loop.call_at(w.last + idle, _idle_check, w)


def _idle_check(w: _Watch) -> None:
    w.timer = None
    idle = w.idle
    if idle is None or w.loop is None:
        return
    now = w.loop.time()
    due = (now if w.in_hook else w.last) + idle
    if due > now:
        w.timer = w.loop.call_at(due, _idle_check, w)
        return
    w.idle = None
    w.timed_out, w.fired = "idle", idle
    try:
        _close_upstream(w, idle)
    except Exception:  # never let a timer callback take anything else down
        log.exception("ctproxy: closing a silent upstream failed")


def _close_upstream(w: _Watch, idle: float) -> None:
    stream = w.stream_ref()
    if stream is None:
        return
    flow = stream.flow
    server = flow.server_conn
    log.warning("ctproxy: upstream %s sent nothing for %g s; closing it (timeouts.stream_idle_seconds)",
                getattr(flow.request, "host", "?"), idle)
    io = _transport(flow, server)
    if io is not None and io.handler is not None:
        io.handler.cancel("ctproxy: upstream idle timeout")


def _start_connect(w: _Watch, cmd: Any) -> None:
    try:
        _start_connect_timer(w, cmd)
    except Exception:
        log.exception("ctproxy: the connect timeout could not be armed")


def _start_connect_timer(w: _Watch, cmd: Any) -> None:
    seconds, _ = _settings()
    if seconds is None or seconds <= 0:
        return
    loop = w.loop or asyncio.get_running_loop()
    w.loop = loop
    w.connect_seconds = seconds
    w.connect_timer = loop.call_later(seconds, _connect_expired, w, cmd.address)


def _connect_expired(w: _Watch, address: Any) -> None:
    w.connect_timer = None
    if w.connect_seconds is None or w.loop is None:
        return
    try:
        stream = w.stream_ref()
        handler = _handler(stream.flow) if stream is not None else None
        if handler is None:
            return
        queued = False
        for conn, io in list(handler.transports.items()):
            if not isinstance(conn, Server) or conn.address != address or conn.error or io.handler is None:
                continue
            if conn.timestamp_start is None:
                queued = True  # not connecting yet (mitmproxy's per-address limit): cancelling would strand it
                continue
            if conn.timestamp_tcp_setup is None:
                # Inside mitmproxy's connect call, whose cancellation it reports as a connect error.
                _connect_timed_out(w, address)
                io.handler.cancel("ctproxy: connect timed out")
                return
            if conn.tls and conn.timestamp_tls_setup is None and io.writer is not None:
                # Connected, the TLS handshake hangs: closing the socket fails the handshake (cancelling the
                # task here could land between mitmproxy's steps and strand the request).
                _connect_timed_out(w, address)
                io.writer.close()
                return
        if queued:
            w.connect_timer = w.loop.call_later(_RECHECK_SECONDS, _connect_expired, w, address)
    except Exception:
        log.exception("ctproxy: the connect timeout failed")


def _connect_timed_out(w: _Watch, address: Any) -> None:
    w.timed_out, w.fired = "connect", w.connect_seconds or 0.0
    log.warning("ctproxy: no connection to upstream %s within %g s (timeouts.connect_seconds)", address[0], w.fired)


def _handler(flow: Any) -> Any:
    from mitmproxy import ctx

    proxyserver = ctx.master.addons.get("proxyserver") if getattr(ctx, "master", None) else None
    if proxyserver is None:
        return None
    return proxyserver.connections.get(flow.client_conn.id)


def _transport(flow: Any, conn: Any) -> Any:
    handler = _handler(flow)
    return handler.transports.get(conn) if handler is not None else None


# ---- answers ----------------------------------------------------------------------------------------

def _timeout_message(w: _Watch) -> str:
    return f"ctproxy: upstream {w.timed_out} timeout ({w.fired:g} s)"


def _needs_frame_count(stream: Any) -> bool:
    """Count SSE frames ourselves only when no tap does (the error event's sequence_number)."""
    from proxy.host.flowstate import state_of

    try:
        return state_of(stream.flow).tap is None
    except Exception:
        return False


def _is_plain_sse(stream: Any) -> bool:
    resp = stream.flow.response
    if resp is None:
        return False
    enc = resp.headers.get("content-encoding", "").strip().lower()
    return resp.headers.get("content-type", "").lower().startswith("text/event-stream") and enc in ("", "identity")


def _next_sequence(stream: Any, w: _Watch) -> int:
    from proxy.host.flowstate import state_of

    tap = state_of(stream.flow).tap
    if tap is not None and hasattr(tap, "events"):
        last = getattr(tap, "last_sequence", None)
        return max(int(tap.events), (last + 1) if isinstance(last, int) else 0)
    return w.frames


def _stream_error(stream: Any, w: _Watch) -> bytes | None:
    """The `error` event for a stream under way, or None when the body cannot take one."""
    if w.error_sent or not _is_plain_sse(stream):
        return None
    w.error_sent = True
    err = errors.idle_timeout(w.fired, streaming=True)
    # A leading blank line ends a frame the upstream left half-written, so our event stands alone (an
    # extra blank line after a complete frame dispatches nothing).
    return b"\n\n" + err.sse_event(_next_sequence(stream, w))


def _replacement(stream: Any, w: _Watch, out: Any) -> list[Any] | None:
    """What to send the agent instead of mitmproxy's protocol error; None keeps mitmproxy's behaviour."""
    client = stream.context.client
    sid = out.stream_id
    if w.headers_sent:
        if w.timed_out != "idle":
            return None  # the upstream broke off mid-answer: the agent sees it as it happened
        data = _stream_error(stream, w)
        if data is None:
            return None
        return [SendHttp(ResponseData(sid, data), client), SendHttp(ResponseEndOfMessage(sid), client)]
    status = out.code.http_status_code()
    if status is None:
        return None  # a kill or a cancel: mitmproxy sends nothing, neither do we
    err = _classify(w, out)
    flow = stream.flow
    log.warning("ctproxy: answered %d %s for %s (upstream %s)", err.status, err.code,
                getattr(flow.request, "method", "?"), getattr(flow.request, "host", "?"))
    from mitmproxy import http

    headers = err.headers()
    if not (flow.request.is_http2 or flow.request.is_http3):
        headers["connection"] = "close"  # as mitmproxy's own error page: the request may be half read
    resp = http.Response.make(err.status, err.body(), headers)
    body = resp.raw_content or b""
    return [SendHttp(ResponseHeaders(sid, resp, False), client), SendHttp(ResponseData(sid, body), client),
            SendHttp(ResponseEndOfMessage(sid), client)]


def _classify(w: _Watch, out: Any) -> errors.ProxyError:
    if w.timed_out == "connect":
        return errors.connect_timeout(w.fired)
    if w.timed_out == "idle":
        return errors.idle_timeout(w.fired, streaming=False)
    code = out.code
    if code is ErrorCode.CONNECT_FAILED:
        return errors.connect_failed(out.message)
    if code is ErrorCode.GENERIC_SERVER_ERROR:
        return errors.upstream_disconnected()
    if code is ErrorCode.RESPONSE_VALIDATION_FAILED:
        return errors.upstream_invalid()
    if code is ErrorCode.RESPONSE_TOO_LARGE:
        return errors.upstream_too_large()
    return errors.proxy_error(out.code.http_status_code() or 502, out.message)


def _json_error_page(status_code: int, message: str = "") -> bytes:
    """`_http1.make_error_response`, in JSON: the answer to a request mitmproxy could not parse."""
    from mitmproxy import http
    from mitmproxy.net.http import http1

    err = errors.proxy_error(status_code, message)
    resp = http.Response.make(err.status, err.body(), {**err.headers(), "connection": "close"})
    return http1.assemble_response(resp)
