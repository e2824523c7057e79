"""The Responses WebSocket stage: a client's socket to `…/responses` ends in ctproxy, and each of its
`response.create` messages runs through this very chain as a `POST …/responses` flow (ADR 0009,
docs/websocket.md). No other stage knows the transport.

It runs after the guard, on two kinds of flow:
- the client's upgrade (`GET …/responses`, `Upgrade: websocket`): routing has chosen the destination and the
  guard has applied the one credential rule to it. The stage keeps, in a one-time job in memory, that
  destination (as ws:// or wss://) and the headers the guard let through (for ctproxy's own socket to the
  upstream), and the client's headers as it sent them (for its creates, which pass the guard again), then
  re-routes the upgrade to the adapter's loopback endpoint (`proxy/ws/server.py`). mitmproxy relays the
  socket to it.
- a create's flow (it carries the connection's key in `x-ctproxy-ws`): every stage has run; a request the
  bridge re-routed to its endpoint stays there (its rounds go over the connection's upstream socket by the
  same key), anything else is re-routed to the adapter's endpoint, which sends it over that socket.
`ctp_ws` false turns the stage off: the socket is then relayed untouched and no stage sees the creates.
`websocket.max_message_bytes` bounds one message, decompressed (default 256 MiB: Codex sends whole requests).
"""

from __future__ import annotations

import weakref

from mitmproxy import ctx, http

from addons._flow import is_reverse
from addons._stage import Stage
from proxy import routes
from proxy.app import runtime
from proxy.bridge.server import PATH_PREFIX as BRIDGE_PREFIX
from proxy.host.flowstate import state_of
from proxy.upstream import WS_HEADER, UpstreamTurns
from proxy.upstream.ws import HANDSHAKE
from proxy.ws import PATH_PREFIX, UP_PREFIX, WsJob, WsService
from proxy.ws.server import CREATE_HEADERS

_WS_HEADER = WS_HEADER.encode()
_OWN = frozenset(k.lower() for k, _ in CREATE_HEADERS) | {"content-encoding", "content-length"}
_CREDENTIALS = frozenset(n.encode() for n in routes.CREDENTIAL_HEADERS)


def is_responses_upgrade(flow: http.HTTPFlow) -> bool:
    req = flow.request
    if req.method != "GET" or req.headers.get("upgrade", "").lower() != "websocket":
        return False
    return req.path.split("?", 1)[0].rstrip("/").endswith("/responses")


class WebSocket(Stage):
    def __init__(self) -> None:
        self._svc: WsService | None = None
        # the client's own headers of each upgrade, before any stage took some off (the creates carry them)
        self._client: weakref.WeakKeyDictionary[http.HTTPFlow, tuple[str, tuple[tuple[str, str], ...]]] = \
            weakref.WeakKeyDictionary()

    def load(self, loader) -> None:
        super().load(loader)
        loader.add_option("ctp_ws", bool, True, "run Responses WebSocket creates through the chain")

    def _enabled(self) -> bool:
        return bool(_option("ctp_ws", True))

    def _service(self, rt: runtime.Runtime) -> WsService:
        if self._svc is None:
            def turns() -> UpstreamTurns:
                if rt.services.upstream is None:
                    rt.services.upstream = UpstreamTurns()
                return rt.services.upstream
            self._svc = WsService(turns, max_message=rt.config.websocket.max_message_bytes)
        return self._svc

    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if is_responses_upgrade(flow) and self._enabled():
            self._client[flow] = (flow.request.path, tuple(flow.request.headers.items(multi=True)))

    async def request(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        if flow.response is not None:
            return
        if any(name.lower() == _WS_HEADER for name, _ in req.headers.fields):
            self._create(flow)
            return
        seen = self._client.pop(flow, None)
        if seen is None or not is_responses_upgrade(flow):
            return
        client_path, client = seen
        svc = self._service(self.rt)
        port = await svc.start()
        scheme = "wss" if req.scheme == "https" else "ws"
        listen = flow.client_conn.sockname
        lhost = f"[{listen[0]}]" if ":" in str(listen[0]) else str(listen[0])
        host = f"[{req.host}]" if ":" in req.host else req.host
        reverse = is_reverse(flow)
        job = WsJob(
            upstream_url=f"{scheme}://{host}:{req.port}{req.path}",
            # what the guard left: the credentials only when their destination was cleared for them
            upstream_headers=tuple((k, v) for k, v in req.headers.items(multi=True) if k.lower() not in HANDSHAKE),
            credentials_allowed=routes.carries_credentials(req.path, req.headers.items(multi=True)),
            # each create goes through this chain: to the listen address (HTTPS proxy mode: through it)
            chain_url=f"http://{lhost}:{listen[1]}{client_path}" if reverse else req.url,
            chain_proxy=None if reverse else f"http://{lhost}:{listen[1]}",
            create_headers=tuple((k, v) for k, v in client if k.lower() not in HANDSHAKE and k.lower() not in _OWN),
            timeout=self.rt.config.timeouts.stream_idle_seconds,
        )
        state_of(flow).transport = "ws"
        route = svc.register(job, req.path)
        req.headers.fields = tuple(f for f in req.headers.fields if f[0].lower() not in _CREDENTIALS)
        req.scheme, req.host, req.port, req.path = "http", "127.0.0.1", port, route
        req.host_header = f"127.0.0.1:{port}"

    def response(self, flow: http.HTTPFlow) -> None:
        """The adapter accepted the client's socket: mitmproxy relays its bytes as they are (its raw TCP
        relay) instead of parsing, re-framing and recording every WebSocket message. The client and the
        adapter then negotiate compression between themselves, and the adapter's message bound applies to
        the decompressed size before anything is inflated elsewhere."""
        if (flow.websocket is not None and flow.response is not None and flow.response.status_code == 101
                and flow.request.path.startswith(PATH_PREFIX) and self.rt.config.websocket.raw_relay
                and _option("rawtcp", True)):
            flow.websocket = None

    def tcp_message(self, flow) -> None:
        """The raw relay records every chunk on its flow for the socket's life: for the adapter's sockets only
        the chunk in flight is kept."""
        svc = self._svc
        if svc is not None and len(flow.messages) > 1 and flow.server_conn.address == ("127.0.0.1", svc.port):
            del flow.messages[:-1]

    def websocket_message(self, flow: http.HTTPFlow) -> None:
        """mitmproxy keeps every message of a socket on its flow (`flow.websocket.messages`) for the socket's
        life: for a socket relayed to the adapter — Codex sends whole requests, hundreds of MiB, for up to an
        hour — only the message being relayed is kept."""
        ws = flow.websocket
        if ws is not None and len(ws.messages) > 1 and flow.request.path.startswith(PATH_PREFIX):
            del ws.messages[:-1]

    def _create(self, flow: http.HTTPFlow) -> None:
        req = flow.request
        key = req.headers.get(WS_HEADER, "")
        svc = self._svc
        if svc is None or not svc.is_live(key):  # not one of ours: the key never leaves
            del req.headers[WS_HEADER]
            return
        state_of(flow).transport = "ws"
        if req.host == "127.0.0.1" and req.path.startswith(BRIDGE_PREFIX):
            return  # the bridge's endpoint sends its rounds over the socket (the key rides along)
        path = req.path
        req.headers.fields = tuple(f for f in req.headers.fields if f[0].lower() not in _CREDENTIALS)
        req.scheme, req.host, req.port = "http", "127.0.0.1", svc.port
        req.path = UP_PREFIX + key + (path if path.startswith("/") else "/" + path)
        req.host_header = f"127.0.0.1:{svc.port}"

    def bound(self, rt: runtime.Runtime) -> None:
        svc = self._svc
        if svc is not None:
            svc.max_message = rt.config.websocket.max_message_bytes  # for the next connections

    async def done(self) -> None:
        svc, self._svc = self._svc, None
        if svc is not None:
            await svc.close()


def _option(name: str, default: object) -> object:
    try:
        return getattr(ctx.options, name)
    except (AttributeError, KeyError):
        return default


addons = [WebSocket()]
