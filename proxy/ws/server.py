"""The loopback endpoint that terminates a client's Responses WebSocket and runs each `response.create`
through the addon chain (ADR 0009).

The WebSocket stage (addons/websocket.py) re-routes the client's upgrade (`GET …/responses`, `Upgrade:
websocket`), once the chain has routed it and the guard has applied the one credential rule to it, to
`/ctp-ws/<key>/…` here, under a one-time job holding the real destination and headers. mitmproxy relays the
socket between the client and this endpoint. The endpoint first opens ctproxy's own socket to the upstream
(`proxy.upstream.ws.open_socket`): an upstream that refuses gets the client the same refusal (status and
body), so Codex falls back to HTTP by itself. Then, per client message:

- `response.create` (a JSON text frame): POSTed, as `{…the create body…, "stream": true}`, to ctproxy's own
  listen address with the client's upgrade headers and the connection's key (`WS_HEADER`). mitmproxy runs the
  whole chain on that flow — routing, session, journal, compaction, context, bridge, web search, guard, body
  writer, request log — exactly as for an HTTP client. Whatever then goes upstream for it (mitmproxy's forward
  through `/ctp-ws-up/<key>/…` here, a bridged round, an overflow retry) goes over the connection's upstream
  socket (`UpstreamTurns.route`). The chain's SSE answer comes back as one text frame per event (the `data:`
  text as it is); an HTTP error answer becomes one `error` event (the upstream's own frame when it was one).
  Creates of one lane (`stream_id`; creates that name none are one lane) run one at a time, in the order they
  came; lanes run at the same time (at most MAX_LANES), each lane's events in order, interleaved with others'.
- a text frame that is not a JSON object: an `error` event from ctproxy; the connection stays usable.
- anything else (`response.steer`, future types, binary frames): sent upstream unchanged, at once.

Frames from the upstream that no create is reading go to the client unchanged and in order. The upstream
closing closes the client's socket with the same code and reason once the current create is answered; the
client leaving closes the upstream socket and cancels the create in flight (mitmproxy then cancels the
bridged turn and its running tools, as for an HTTP client that hangs up).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import WSCloseCode, WSMsgType, web

from proxy.host import loopback
from proxy.host.loopback import JOB_TTL, Loopback, job_path, new_job
from proxy.upstream import UpstreamBroken, UpstreamTurns, UpstreamUnavailable
from proxy.upstream.ws import (
    HANDSHAKE,
    WS_HEADER,
    SocketRefused,
    UpstreamSocket,
    lane_of,
    open_socket,
    register,
    unregister,
)

log = logging.getLogger("ctproxy.ws")
_CLOSING: set[asyncio.Task[None]] = set()  # upstream sockets being closed (held here until they are)

PATH_PREFIX = "/ctp-ws/"  # the client's upgrade, re-routed here
UP_PREFIX = "/ctp-ws-up/"  # a create's flow, when the chain forwards it: over the connection's upstream socket
DEFAULT_MAX_MESSAGE = 256 * 1024 * 1024
LINGER = 10.0  # after a 1009 close: how long the rest of the oversized message is read and dropped, at most
MAX_PENDING = 16  # creates a connection may have waiting behind the running ones (each may be hundreds of MiB)
MAX_LANES = 16  # lanes of one connection whose creates run at the same time (each one flow through the chain)
# What a create's POST says about itself (the client's upgrade headers of these names are left out).
CREATE_HEADERS = (("Content-Type", "application/json"), ("Accept", "text/event-stream"),
                  ("Accept-Encoding", "identity"))
# What the upstream's refusal and the create's answer do not pass on.
DROP_RESPONSE = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding",
                           "date", "server", "upgrade"})


def agent_path(path: str) -> str:
    """The path the client asked for, of a request the WebSocket stage re-routed: what logs show (never the
    connection's key)."""
    return loopback.agent_path(path, PATH_PREFIX, UP_PREFIX)


@dataclass
class WsJob:
    """What the stage knew about the client's upgrade when it re-routed it (in memory only)."""

    upstream_url: str  # ws:// or wss://, the real destination
    upstream_headers: tuple[tuple[str, str], ...] = field(repr=False)  # after the guard: credentials only if cleared
    credentials_allowed: bool
    chain_url: str  # where each create is POSTed: ctproxy's own listen address and the client's path
    create_headers: tuple[tuple[str, str], ...] = field(repr=False)  # the client's upgrade headers, as it sent them
    timeout: float | None = 300.0  # until a turn's first event
    chain_proxy: str | None = None  # HTTPS proxy mode: the listen address, as the proxy to POST through


class _ClientSocket(web.WebSocketResponse):
    """The client's socket. A message above the limit is answered with a 1009 close frame; then, instead of
    closing the TCP connection at once (aiohttp's way: with the rest of the oversized message still arriving,
    the kernel resets the connection and the close frame is lost — mitmproxy's raw relay never passes it to
    the client, which waits for its own timeout), only the adapter's sending side is shut (FIN after the close
    frame) and what still arrives is read and dropped until the client (through mitmproxy) closes its side or
    LINGER seconds pass: a lingering close, as HTTP servers do after refusing a large body."""

    lingering = False

    def _set_code_close_transport(self, code: Any) -> None:
        if getattr(self, "_close_code", None) == WSCloseCode.MESSAGE_TOO_BIG and not self.lingering:
            req = getattr(self, "_req", None)
            transport = req.transport if req is not None else None
            if transport is not None and not transport.is_closing() and transport.can_write_eof():
                self.lingering = True
                transport.write_eof()
                return
        super()._set_code_close_transport(code)

    async def linger(self, transport: asyncio.BaseTransport | None) -> None:
        """After a 1009 close: wait (bounded) until the client closed its side, then close the connection."""
        if not self.lingering or transport is None:
            return
        try:
            async with asyncio.timeout(LINGER):
                while not transport.is_closing():
                    await asyncio.sleep(0.05)
        except TimeoutError:
            pass
        finally:
            transport.close()


def error_frame(status: int, code: str, message: str, type_: str = "invalid_request_error") -> str:
    return orjson.dumps({"type": "error", "status": status,
                         "error": {"type": type_, "code": code, "message": message, "param": None}}).decode()


def with_lane(text: str, lane: str | None) -> str:
    """An event frame of a create on lane `lane`, naming it (`stream_id`) as the upstream's own events do: the
    events ctproxy makes itself (its errors, the bridge's merged lifecycle) get it added at the end."""
    if lane is None or '"stream_id"' in text or not text.endswith("}"):
        return text
    return text[:-1] + ',"stream_id":' + orjson.dumps(lane).decode() + "}"


class _Sse:
    """Splits an SSE byte stream into each event's data text (the `data:` lines joined by newlines)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk if self._buf else chunk
        out: list[str] = []
        start = 0
        while True:
            end = buf.find(b"\n\n", start)
            if end < 0:
                break
            block = buf[start:end]
            start = end + 2
            data = [ln[5:].removeprefix(b" ") for ln in block.split(b"\n") if ln.startswith(b"data:")]
            if data:
                out.append(b"\n".join(data).decode())
        self._buf = buf[start:]
        return out


@dataclass
class WsService:
    """The adapter's endpoint and its jobs (one per process, on 127.0.0.1 and a random port)."""

    turns_of: Any  # () -> UpstreamTurns
    max_message: int = DEFAULT_MAX_MESSAGE
    port: int = 0
    connections: int = 0  # open client connections
    creates: int = 0  # creates run through the chain
    _jobs: OrderedDict[str, tuple[float, WsJob]] = field(default_factory=OrderedDict)
    _live: dict[str, WsJob] = field(default_factory=dict)  # connection key → its job, while it is open
    _endpoint: Loopback = field(default_factory=Loopback)
    _http: aiohttp.ClientSession | None = None

    async def start(self) -> int:
        self.port = await self._endpoint.start(self._app)
        return self.port

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=self.max_message + 1024 * 1024)
        app.router.add_get(PATH_PREFIX + "{job}/{rest:.*}", self._upgrade)
        app.router.add_post(UP_PREFIX + "{conn}/{rest:.*}", self._forward)
        return app

    def register(self, job: WsJob, path: str) -> str:
        """The path to re-route the client's upgrade to (its key, then the client's own path)."""
        return job_path(PATH_PREFIX, new_job(self._jobs, job, time.monotonic()), path)

    def is_live(self, conn: str) -> bool:
        return conn in self._live

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                connector=aiohttp.TCPConnector(limit=0, force_close=False))
        return self._http

    async def close(self) -> None:
        await self._endpoint.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # ---- the client's socket -------------------------------------------------------------------

    async def _upgrade(self, request: web.Request) -> web.StreamResponse:
        entry = self._jobs.pop(request.match_info["job"], None)
        if entry is None or entry[0] < time.monotonic() - JOB_TTL:
            return _json_error(404, "unknown_ws_job", "no such WebSocket upgrade (it expired)")
        job = entry[1]
        offered = "permessage-deflate" in request.headers.get("Sec-WebSocket-Extensions", "").lower()
        protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        try:
            sock = await open_socket(job.upstream_url, job.upstream_headers, job.credentials_allowed,
                                     max_message=self.max_message, compress=offered, protocols=protocols)
        except SocketRefused as refused:  # the client sees the refusal itself (Codex falls back to HTTP)
            headers = [(k, v) for k, v in refused.headers if k.lower() not in DROP_RESPONSE]
            return web.Response(status=refused.status, headers=headers, body=refused.body)
        except UpstreamUnavailable:
            return _json_error(502, "upstream_unavailable", "the upstream's WebSocket could not be reached")
        client = _ClientSocket(max_msg_size=self.max_message, compress=offered, autoping=True,
                                       protocols=(sock.ws.protocol,) if sock.ws.protocol else ())
        try:
            await client.prepare(request)
        except BaseException:
            await sock.close()
            raise
        conn = _Connection(self, job, client, sock, secrets.token_urlsafe(18))
        self.connections += 1
        try:
            await conn.run()
        finally:
            self.connections -= 1
        await client.linger(request.transport)
        return client

    # ---- a create's flow, forwarded by the chain -------------------------------------------------

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        conn = request.match_info["conn"]
        job = self._live.get(conn)
        if job is None or request.headers.get(WS_HEADER) != conn:
            return _json_error(404, "unknown_ws_connection", "no such WebSocket connection (it closed)")
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HANDSHAKE]
        headers.append((WS_HEADER, conn))
        turns: UpstreamTurns = self.turns_of()
        up = turns.prepare("POST", job.upstream_url, headers, body, False)  # the socket is already authenticated
        try:
            async with turns.stream(up, job.timeout) as answer:
                resp = web.StreamResponse(status=answer.status)
                for k, v in answer.headers:
                    if k.lower() not in DROP_RESPONSE:
                        resp.headers[k] = v
                await resp.prepare(request)
                async for chunk in answer.chunks:
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except UpstreamUnavailable as exc:
            code = 504 if exc.category == "timeout" else 502
            return _json_error(code, "upstream_unavailable", f"the upstream's WebSocket is gone ({exc.category})")
        except UpstreamBroken:
            if request.transport is not None:
                request.transport.close()  # the answer breaks off, as the upstream's did
            raise


@dataclass(eq=False)
class _Connection:
    svc: WsService
    job: WsJob
    client: web.WebSocketResponse
    sock: UpstreamSocket
    key: str
    lanes: dict[str | None, deque[tuple[str, dict[str, Any]]]] = field(default_factory=dict)  # waiting creates
    workers: dict[str | None, asyncio.Task[None]] = field(default_factory=dict)  # one per lane with creates
    pending: int = 0  # creates waiting (not yet running), all lanes
    running: int = 0
    slots: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_LANES))
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # no create is running

    async def run(self) -> None:
        svc, sock = self.svc, self.sock
        svc._live[self.key] = self.job
        register(self.key, sock)
        sock.on_idle = self._from_upstream
        sock.on_closed = self._upstream_closed
        sock.start()
        self.idle.set()
        try:
            async for msg in self.client:
                if msg.type == WSMsgType.TEXT:
                    await self._from_client(msg.data)
                elif msg.type == WSMsgType.BINARY:
                    await self._to_upstream(msg)
        finally:
            unregister(self.key)
            svc._live.pop(self.key, None)
            workers = list(self.workers.values())
            for worker in workers:
                worker.cancel()  # a create in flight: its POST is dropped, and mitmproxy cancels its turn
            for worker in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
            code = self.client.close_code
            # The client's code goes upstream even when mitmproxy hangs up on the adapter meanwhile (aiohttp then
            # cancels this handler, and a cancelled close would drop the socket with no close frame).
            closing = asyncio.get_running_loop().create_task(sock.close(
                code=code if code is not None and 1000 <= code < 5000 and code not in (1005, 1006) else 1000))
            _CLOSING.add(closing)
            closing.add_done_callback(_CLOSING.discard)
            await asyncio.shield(closing)

    async def _from_client(self, text: str) -> None:
        kind, obj = "", None
        try:
            obj = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
        if not isinstance(obj, dict):
            await self._send(error_frame(400, "invalid_json", "ctproxy could not parse this message: each client "
                                                             "message must be one JSON object (a text frame)."))
            return
        kind = obj.get("type")
        if kind == "response.create":
            lane = lane_of(obj)
            if self.pending >= MAX_PENDING:
                await self._send(with_lane(error_frame(
                    429, "too_many_pending_creates", f"ctproxy holds at most {MAX_PENDING} creates waiting on one "
                    "connection; wait for the running ones to end."), lane))
                return
            self.pending += 1
            waiting = self.lanes.get(lane)
            if waiting is None:
                waiting = self.lanes[lane] = deque()
            waiting.append((text, obj))
            if lane not in self.workers:
                self.workers[lane] = asyncio.get_running_loop().create_task(self._lane(lane, waiting))
        else:  # response.steer, future types: ctproxy does not interpret them
            await self._to_upstream(text)

    async def _lane(self, lane: str | None, waiting: deque[tuple[str, dict[str, Any]]]) -> None:
        """One lane's creates, one at a time in the order they came (other lanes run meanwhile)."""
        try:
            while waiting:
                async with self.slots:
                    text, obj = waiting.popleft()
                    self.pending -= 1
                    self.running += 1
                    self.idle.clear()
                    try:
                        await self._create(lane, text, obj)
                    except asyncio.CancelledError:
                        raise
                    except Exception:
                        log.exception("ws: a create failed in the adapter")
                        await self._send(with_lane(error_frame(500, "ctproxy_error", "ctproxy could not run this "
                                                               "request.", "server_error"), lane))
                    finally:
                        self.running -= 1
                        if not self.running:
                            self.idle.set()
        finally:
            if self.workers.get(lane) is asyncio.current_task():
                del self.workers[lane]
            if self.lanes.get(lane) is waiting:
                self.pending -= len(waiting)
                del self.lanes[lane]

    async def _to_upstream(self, msg: Any) -> None:
        try:
            if isinstance(msg, str):
                await self.sock.ws.send_str(msg)
            else:
                await self.sock.ws.send_bytes(msg.data)
        except (ConnectionError, RuntimeError, aiohttp.ClientError):
            log.debug("ws: a message could not be sent upstream (the socket closed)")

    async def _from_upstream(self, msg: aiohttp.WSMessage) -> None:
        if msg.type == WSMsgType.TEXT:
            await self._send(msg.data)
        else:
            async with self.send_lock:
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self.client.send_bytes(msg.data)

    async def _upstream_closed(self, code: int | None, reason: str) -> None:
        # The creates in flight (if any) end with the upstream's error first; then the client's socket closes
        # with the upstream's code.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10.0):
                await self.idle.wait()
        if not self.client.closed:
            usable = code is not None and 1000 <= code < 5000 and code not in (1005, 1006)
            await self.client.close(code=code if usable else 1011, message=reason.encode()[:120])

    async def _send(self, text: str) -> None:
        async with self.send_lock:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.client.send_str(text)

    async def _create(self, lane_key: str | None, text: str, obj: dict[str, Any]) -> None:
        svc, sock, job = self.svc, self.sock, self.job
        body = {k: v for k, v in obj.items() if k != "type"}
        client_stream = "stream" in body
        body["stream"] = True  # the chain's stages see a streamed create, as the socket's turns are
        data = orjson.dumps(body)
        lane = sock.begin(lane_key, data, text, client_stream)
        svc.creates += 1
        headers = [*job.create_headers, *CREATE_HEADERS, (WS_HEADER, self.key)]
        try:
            try:
                async with svc._client().post(job.chain_url, data=data, headers=headers, proxy=job.chain_proxy,
                                              ssl=False) as resp:
                    ctype = resp.headers.get("Content-Type", "").lower()
                    if resp.status == 200 and ctype.startswith("text/event-stream"):
                        sse = _Sse()
                        async for chunk in resp.content.iter_any():
                            for event in sse.feed(chunk):
                                await self._send(with_lane(event, lane_key))
                        return
                    answer = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, ConnectionError) as exc:
                log.info("ws: a create's answer broke off (%s)", type(exc).__name__)
                await self._send(with_lane(error_frame(502, "upstream_broken", "the answer broke off before it "
                                                       "completed.", "server_error"), lane_key))
                return
            known = lane.error_verbatim
            if known is not None and known[0] == answer:
                await self._send(known[1])  # the upstream's own error frame
                return
            await self._send(with_lane(_error_event(status, answer), lane_key))
        finally:
            sock.end(lane)


def _error_event(status: int, body: bytes) -> str:
    """An HTTP error answer of the chain (the guard's 403, a 413, an unreachable upstream) as an error event."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    err = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(err, dict):
        text = body[:300].decode(errors="replace").strip() if body else ""
        err = {"type": "server_error" if status >= 500 else "invalid_request_error", "code": None,
               "message": text or f"HTTP {status}", "param": None}
    return orjson.dumps({"type": "error", "status": status, "error": err}).decode()


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.Response(status=status, content_type="application/json",
                        body=orjson.dumps({"error": {"message": message, "type": "ctproxy_ws", "code": code,
                                                     "param": None}}))
