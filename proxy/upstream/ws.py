"""ctproxy's own Responses WebSocket toward the upstream, one per client connection (ADR 0009).

The client's socket ends in ctproxy (`proxy/ws/`); each of its `response.create` messages runs through the
addon chain as a `POST …/responses` flow, and what that flow sends upstream — mitmproxy's forward (through
the adapter's loopback endpoint), a bridged round, compaction's overflow retry — reaches `UpstreamTurns`
carrying the connection's key in `WS_HEADER`. `UpstreamTurns` then sends it over this socket instead of HTTP
(`socket_transport`): the request body becomes one `response.create` text frame (the client's own text,
byte for byte, when no stage changed the body), and the answer is the turn's events framed as SSE
(`event:` + `data:` with the frame's text unchanged), up to and including the terminal event, so the stages
read it as they read any streamed answer. An `error` event as a turn's first event is answered like the HTTP
error it stands for (its status, `{"error": …}` as JSON): overflow recovery works as on HTTP, and the
adapter gives the client the upstream's own frame back.

Lanes (`stream_id`): each lane's turns go one at a time, in order; turns of different lanes go at the same
time over the one socket, and the reader gives each event to the turn of the lane it names (the upstream echoes
a create's `stream_id` on its events). Frames that arrive while no turn of their lane is reading (answers to
messages ctproxy does not interpret, events after a turn's terminal event) go to the client as they are
(`on_idle`), in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.errors import UpstreamError
from proxy.routes import CREDENTIAL_HEADERS, credential_protocol, without_query_credentials
from proxy.upstream import trust
from proxy.upstream.transport import Answer, UpstreamBroken, UpstreamRequest, UpstreamUnavailable

log = logging.getLogger("ctproxy.ws")

WS_HEADER = "x-ctproxy-ws"  # the connection key a create's flow carries (loopback only; never sent upstream)
TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
# Not copied from the client's upgrade to ctproxy's own: the handshake's own headers and hop-by-hop ones.
HANDSHAKE = frozenset({"host", "upgrade", "connection", "sec-websocket-key", "sec-websocket-version",
                       "sec-websocket-extensions", "sec-websocket-accept", "sec-websocket-protocol",
                       "content-length", "transfer-encoding", "keep-alive", "proxy-connection", "te",
                       "accept-encoding", WS_HEADER})
_CLOSED = object()
_ENDED = frozenset({aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED,
                    aiohttp.WSMsgType.ERROR})  # the upstream socket ended while a turn was reading


class SocketRefused(UpstreamError):
    """The upstream answered the upgrade with an HTTP status instead of 101 (426: no WebSocket mode)."""

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes):
        super().__init__(status)
        self.status, self.headers, self.body = status, headers, body


def event_type(text: str) -> str:
    """The `type` of an event frame, read off its start when it comes first (the upstream's events do);
    else parsed. '' for a frame that is not a JSON object."""
    if text.startswith('{"type":"'):
        end = text.find('"', 9)
        if end > 0 and "\\" not in text[9:end]:
            return text[9:end]
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ""
    kind = obj.get("type") if isinstance(obj, dict) else None
    return kind if isinstance(kind, str) else ""


def sse_frame(kind: str, text: str) -> bytes:
    """One event as SSE: its text as the data (one `data:` line per line of it, so joining gives it back)."""
    data = text.encode()
    if b"\n" in data:
        data = data.replace(b"\n", b"\ndata: ")
    return b"event: " + kind.encode() + b"\ndata: " + data + b"\n\n"


def stream_id_of(text: str) -> str | None:
    """The lane (`stream_id`) an event frame names, None when it names none. A frame that does not hold the
    text `"stream_id"` (a quote inside a JSON string is escaped, so it cannot come from a value) is not
    parsed."""
    if '"stream_id"' not in text:
        return None
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    sid = obj.get("stream_id") if isinstance(obj, dict) else None
    return sid if isinstance(sid, str) else None


def lane_of(payload: Any) -> str | None:
    """The lane a create names (`stream_id`, a string), None for the default lane."""
    sid = payload.get("stream_id") if isinstance(payload, dict) else None
    return sid if isinstance(sid, str) else None


@dataclass(eq=False)
class Lane:
    """One `stream_id` lane of a socket (the key None: creates that name none). Its turns go one at a time
    (`lock`), FIFO; different lanes' turns go at the same time, and the reader gives each event to the lane it
    names."""

    key: str | None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    sink: asyncio.Queue[Any] | None = None  # the turn reading now
    # (body as POSTed through the chain, the client's frame): an unchanged body goes as that frame
    verbatim: tuple[bytes, str] | None = None
    client_stream: bool = False  # the client's create had a `stream` field (kept; else the chain's is dropped)
    error_verbatim: tuple[bytes, str] | None = None  # (the HTTP error body made of an error event, its frame)
    users: int = 0  # the adapter's create on it, and turns holding or waiting for its lock


@dataclass(eq=False)
class UpstreamSocket:
    """One upstream socket: sends one create at a time per lane and routes what comes back (see the module)."""

    ws: aiohttp.ClientWebSocketResponse
    http: aiohttp.ClientSession
    on_idle: Callable[[aiohttp.WSMessage], Awaitable[None]] | None = None
    on_closed: Callable[[int | None, str], Awaitable[None]] | None = None
    lanes: dict[str | None, Lane] = field(default_factory=dict)
    laned: bool = False  # a create named a `stream_id`: events are routed by theirs
    close_code: int | None = None
    close_reason: str = ""
    turns: int = 0
    reader: asyncio.Task[None] | None = None
    _parsed: tuple[bytes, Any] | None = field(default=None, repr=False)  # the last body parsed, and its payload

    def start(self) -> None:
        self.reader = asyncio.get_running_loop().create_task(self._read())

    # ---- lanes -------------------------------------------------------------------------------------------

    def _lane(self, key: str | None) -> Lane:
        lane = self.lanes.get(key)
        if lane is None:
            lane = self.lanes[key] = Lane(key)
            if key is not None:
                self.laned = True
        return lane

    def _leave(self, lane: Lane) -> None:
        lane.users -= 1
        if lane.users <= 0 and not lane.lock.locked() and lane.sink is None and self.lanes.get(lane.key) is lane:
            del self.lanes[lane.key]  # a connection may name many lanes over an hour: only live ones are kept

    def begin(self, key: str | None, body: bytes, text: str, client_stream: bool) -> Lane:
        """The adapter starts a create on lane `key`: `body` as it POSTs it through the chain, `text` the
        client's frame (sent as it is if the chain forwards `body` unchanged)."""
        lane = self._lane(key)
        lane.users += 1
        lane.verbatim, lane.client_stream, lane.error_verbatim = (body, text), client_stream, None
        return lane

    def end(self, lane: Lane) -> None:
        lane.verbatim = None
        self._leave(lane)

    def _verbatim_lane(self, body: bytes) -> Lane | None:
        for lane in self.lanes.values():
            if lane.verbatim is not None and lane.verbatim[0] == body:
                return lane
        return None

    def _sink_for(self, text: str) -> Lane | None:
        """The lane whose turn an event frame belongs to, if one is reading."""
        if not self.laned:
            lane = self.lanes.get(None)
            return lane if lane is not None and lane.sink is not None else None
        sid = stream_id_of(text)
        lane = self.lanes.get(sid)
        if lane is not None and lane.sink is not None:
            return lane
        reading = [ln for ln in self.lanes.values() if ln.sink is not None]
        if len(reading) == 1 and sid is None:
            return reading[0]  # an upstream that does not echo lanes: the one turn reading
        return None

    async def _read(self) -> None:
        ws = self.ws
        reason = ""
        try:
            while True:
                msg = await ws.receive()
                if msg.type in _ENDED:
                    if msg.type == aiohttp.WSMsgType.CLOSE and isinstance(msg.extra, str):
                        reason = msg.extra
                    break
                if msg.type == aiohttp.WSMsgType.TEXT:
                    lane = self._sink_for(msg.data)
                    if lane is not None and lane.sink is not None:
                        kind = event_type(msg.data)
                        lane.sink.put_nowait((kind, msg.data))
                        if kind in TERMINAL:
                            lane.sink = None  # what follows is no longer this turn's
                        continue
                if msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY) and self.on_idle is not None:
                    await self.on_idle(msg)
        except Exception:  # the connection broke: handled as a close below
            log.debug("ws: the upstream socket's reader stopped", exc_info=True)
        finally:
            self.close_code = ws.close_code if ws.close_code is not None else 1006
            self.close_reason = reason
            for lane in list(self.lanes.values()):
                if lane.sink is not None:
                    lane.sink.put_nowait(_CLOSED)
                    lane.sink = None
            if self.on_closed is not None:
                await self.on_closed(self.close_code, self.close_reason)

    def _payload(self, body: bytes) -> Any:
        parsed = self._parsed
        if parsed is not None and (parsed[0] is body or parsed[0] == body):
            return parsed[1]
        payload = orjson.loads(body)
        self._parsed = (body, payload)
        return payload

    def is_turn_of(self, body: bytes) -> bool:
        """Whether a create the chain sends for this connection is a turn of the socket: the client's own
        create, or one built on it (a bridged round, an overflow retry), all streamed. A create that asks for
        a held answer (`"stream": false`: ctproxy's own side turn, the context stage's checkpoint turn) is not:
        the socket only streams, and its answer would become the connection's latest response and break the
        client's `previous_response_id` chain (with `store: false` only the latest is kept)."""
        if self._verbatim_lane(body) is not None:
            return True
        try:
            payload = self._payload(body)
        except orjson.JSONDecodeError:
            return True  # refused as a turn by `turn` (never sent elsewhere)
        if isinstance(payload, dict) and payload.get("stream") is False:
            self._parsed = None  # not sent here: nothing of it kept
            return False
        return True

    def message_for(self, body: bytes) -> tuple[str | None, str]:
        """The lane and the create frame for a body the chain forwarded: the client's own text when
        unchanged."""
        lane = self._verbatim_lane(body)
        if lane is not None and lane.verbatim is not None:
            return lane.key, lane.verbatim[1]
        payload = self._payload(body)
        self._parsed = None
        if not isinstance(payload, dict):
            raise ValueError("not a JSON object")
        key = lane_of(payload)
        known = self.lanes.get(key)
        payload = dict(payload)
        if known is None or not known.client_stream:
            payload.pop("stream", None)  # the chain's, not the client's: WebSocket turns always stream
        payload.pop("type", None)
        return key, orjson.dumps({"type": "response.create", **payload}).decode()

    @asynccontextmanager
    async def turn(self, body: bytes, timeout: float | None) -> AsyncIterator[Answer]:
        """Send one create and read its events (an `Answer` as the HTTP transport gives one). Its lane is the
        turn's from sending until its terminal event was read (a lane is FIFO; other lanes go on meanwhile); a
        reader that stays in the context after that (the bridge sending its next round) does not hold it."""
        try:
            key, text = self.message_for(body)
        except (orjson.JSONDecodeError, ValueError):
            raise UpstreamUnavailable("connection") from None
        lane = self._lane(key)
        lane.users += 1
        try:
            await lane.lock.acquire()
        except BaseException:
            self._leave(lane)
            raise
        held = [True]
        sink: asyncio.Queue[Any] = asyncio.Queue()

        def release() -> None:
            if held[0]:
                held[0] = False
                if lane.sink is sink:
                    lane.sink = None
                lane.lock.release()
                self._leave(lane)

        try:
            if self.close_code is not None or self.ws.closed:
                raise UpstreamUnavailable("connection")
            lane.sink = sink
            try:
                await self.ws.send_str(text)
            except (ConnectionError, aiohttp.ClientError, RuntimeError):
                raise UpstreamUnavailable("connection") from None
            self.turns += 1
            try:
                async with asyncio.timeout(timeout):
                    first = await sink.get()
            except TimeoutError:
                raise UpstreamUnavailable("timeout") from None
            if first is _CLOSED:
                raise UpstreamUnavailable("connection")
            kind, frame = first
            if kind == "error":
                answer = self._error_answer(frame, lane)
                release()
                yield answer
                return
            yield Answer(200, [("Content-Type", "text/event-stream; charset=utf-8")],
                         self._events(kind, frame, sink, release))
        finally:
            release()

    @staticmethod
    def _error_answer(frame: str, lane: Lane) -> Answer:
        try:
            event = orjson.loads(frame)
        except orjson.JSONDecodeError:
            event = {}
        status = event.get("status") if isinstance(event, dict) else None
        status = status if isinstance(status, int) and 400 <= status < 600 else 400
        err = event.get("error") if isinstance(event, dict) else None
        if not isinstance(err, dict):
            err = {k: v for k, v in event.items() if k not in ("type", "status", "sequence_number")} \
                if isinstance(event, dict) else {}
        body = orjson.dumps({"error": err})
        lane.error_verbatim = (body, frame)

        async def one() -> AsyncIterator[bytes]:
            yield body

        return Answer(status, [("Content-Type", "application/json")], one())

    @staticmethod
    async def _events(kind: str, frame: str, sink: asyncio.Queue[Any],
                      release: Callable[[], None]) -> AsyncIterator[bytes]:
        """The turn's events as SSE, each chunk every event that had already arrived (one write downstream for
        a burst, not one per event)."""
        while True:
            out = [sse_frame(kind, frame)]
            while kind not in TERMINAL and not sink.empty():
                item = sink.get_nowait()
                if item is _CLOSED:
                    release()
                    yield b"".join(out)
                    raise UpstreamBroken()
                kind, frame = item
                out.append(sse_frame(kind, frame))
            if kind in TERMINAL:
                release()  # the socket is free for the next turn before the reader even sees the end
                yield b"".join(out)
                return
            yield b"".join(out)
            item = await sink.get()
            if item is _CLOSED:
                release()
                raise UpstreamBroken()
            kind, frame = item

    async def close(self, code: int = 1000, message: bytes = b"") -> None:
        try:
            if not self.ws.closed:
                await self.ws.close(code=code, message=message)
        finally:
            if self.reader is not None and not self.reader.done():
                self.reader.cancel()
            await self.http.close()


async def open_socket(url: str, headers: Sequence[tuple[str, str]], credentials_allowed: bool, *,
                      max_message: int, compress: bool, protocols: Sequence[str] = (),
                      timeout: float = 30.0) -> UpstreamSocket:
    """Open ctproxy's socket to `url` (ws:// or wss://) with the client's upgrade headers (credentials only
    when the destination was cleared for them: the one credential rule, decided by the caller). Raises
    SocketRefused (the upstream's status and body) or UpstreamUnavailable."""
    kept = [(k, v) for k, v in headers if k.lower() not in HANDSHAKE
            and (credentials_allowed or k.lower() not in CREDENTIAL_HEADERS)]
    if not credentials_allowed:  # the other carriers of a key, under the same rule
        url = without_query_credentials(url)
        protocols = [p for p in protocols if credential_protocol(p) is None]
    http = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False,
                                 timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout))
    try:
        ws = await http.ws_connect(url, headers=kept, max_msg_size=max_message, compress=15 if compress else 0,
                                   autoping=True, protocols=tuple(protocols), ssl=trust.client_ssl(),
                                   timeout=aiohttp.ClientWSTimeout(
                                       ws_receive=None, ws_close=10.0))
    except aiohttp.WSServerHandshakeError as exc:
        await http.close()
        raise SocketRefused(exc.status, [(k, v) for k, v in (exc.headers or {}).items()],
                            str(exc.message).encode()) from None
    except (aiohttp.ClientError, OSError, TimeoutError):
        await http.close()
        raise UpstreamUnavailable("connection") from None
    except BaseException:
        await http.close()
        raise
    return UpstreamSocket(ws, http)


_SOCKETS: dict[str, UpstreamSocket] = {}


def register(key: str, sock: UpstreamSocket) -> None:
    _SOCKETS[key] = sock


def unregister(key: str) -> None:
    _SOCKETS.pop(key, None)


def socket_of(request: UpstreamRequest) -> UpstreamSocket | None:
    """The socket a request is to go over (its WS_HEADER), if any."""
    for name, value in request.headers:
        if name.lower() == WS_HEADER:
            return _SOCKETS.get(value)
    return None


def is_ws_request(request: UpstreamRequest) -> bool:
    return any(name.lower() == WS_HEADER for name, _ in request.headers)


def is_socket_turn(request: UpstreamRequest) -> bool:
    """A `POST …/responses` that carries a connection key goes over that connection's socket unless it is
    ctproxy's own held turn (`UpstreamSocket.is_turn_of`); a key whose socket is gone: the socket's (which
    answers that the upstream cannot be reached, never a fallback to HTTP)."""
    if request.method != "POST" or not request.url.split("?", 1)[0].endswith("/responses"):
        return False
    sock = socket_of(request)
    return sock is None or sock.is_turn_of(request.body)


class SocketTransport:
    """The `Transport` for requests that carry a connection key: over that connection's upstream socket.
    A key whose socket is gone is an upstream that cannot be reached (never a fallback to HTTP)."""

    @asynccontextmanager
    async def open(self, request: UpstreamRequest, timeout: float | None) -> AsyncIterator[Answer]:
        sock = socket_of(request)
        if sock is None:
            raise UpstreamUnavailable("connection")
        async with sock.turn(request.body, timeout) as answer:
            yield answer

    async def close(self) -> None:
        return None


SOCKET_TRANSPORT = SocketTransport()
