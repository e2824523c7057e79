"""The embedded mitmproxy master: only the mitmproxy addons ctproxy uses.

`DumpMaster` loads 35 addons (map/modify/sticky/anticache/export/cut/browser/…, the flow dumper, stdin
reading) and mitmproxy offers every event of every flow to each of them; ctproxy exposes none of their
options. Measured, mitmproxy's dispatch costs ≈9 µs per addon per event, so the unused ones cost tens
of microseconds of CPU per request and delay the first byte of a stream. What stays, and why:
"""

from __future__ import annotations

from typing import Any

KEPT = (  # module names in mitmproxy.addons
    "core",  # options and commands every master needs
    "block",  # refuses clients from non-local addresses (block_global): defence in depth next to loopback
    "proxyserver",  # the listening servers and connection handling
    "next_layer",  # protocol detection (HTTP/1, HTTP/2, TLS in regular mode)
    "tlsconfig",  # certificates for regular mode and HTTPS upstreams
    "disable_h2c",  # refuses h2c upgrades mitmproxy cannot proxy
    "update_alt_svc",  # reverse mode: Alt-Svc must not send clients around the proxy
    "serverplayback",  # --server-replay
    "onboarding",  # regular mode: http://mitm.it serves the CA certificate for clients to trust
)


def build_master(options: Any, with_termlog: bool) -> Any:
    """A mitmproxy Master with ctproxy's options and the mitmproxy addons in `KEPT`, in mitmproxy's order."""
    from mitmproxy import addons as mitm_addons
    from mitmproxy.master import Master

    from proxy.host import httpstream, sendbatch

    httpstream.install()  # JSON errors and upstream timeouts (proxy/host/httpstream.py)
    sendbatch.install()  # one send per connection and loop turn (proxy/host/sendbatch.py)
    master = Master(options, with_termlog=with_termlog)
    kept = [a for a in mitm_addons.default_addons() if _name(a) in KEPT]
    master.addons.add(*kept)  # no KeepServing: ctproxy runs until it is stopped, replay or not
    if not with_termlog:
        _warnings_to_stderr()
    return master


def _warnings_to_stderr() -> None:
    """Without mitmproxy's terminal log (`--debug` turns it on) nothing would print ctproxy's warnings: a
    closed silent upstream, a refused body. Those lines (categories and sizes, never content) go to stderr."""
    import logging

    logger = logging.getLogger("ctproxy")
    if any(getattr(h, "_ctp_warnings", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler()
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
    handler._ctp_warnings = True  # type: ignore[attr-defined]
    logger.addHandler(handler)


def _name(addon: Any) -> str:
    return type(addon).__module__.rsplit(".", 1)[-1]


def share_listen_port() -> None:
    """Worker processes of `ctproxy up --workers N` (proxy/app/workers.py) listen on one address together: each
    binds its TCP socket with SO_REUSEPORT and the kernel spreads new connections over them. mitmproxy's servers
    are started by `AsyncioServerInstance.listen`; in a worker it binds TCP with `reuse_port` (port 0 keeps
    mitmproxy's own way: the supervisor hands its workers a port it holds).

    Reverse mode to an `https` upstream (the default, api.openai.com) has transport `both`: mitmproxy also
    serves HTTP/3 (QUIC) on the same port over UDP. Its UDP server (mitmproxy_rs) cannot share a port, and the
    kernel's UDP spreading would move a QUIC connection to another worker whenever one restarts, so only
    worker 1 serves UDP; the others serve TCP only (the agents ctproxy serves speak HTTP/1.1 and HTTP/2 over
    TCP). Before, a worker fell back to mitmproxy's own listen there and worker 2 failed: address in use."""
    import asyncio

    from mitmproxy.proxy import mode_servers

    from proxy import workerid

    cls = mode_servers.AsyncioServerInstance
    original = cls.listen
    if getattr(original, "_ctp_reuse_port", False):
        return

    async def listen(self: Any, host: str, port: int) -> list[Any]:
        transport = self.mode.transport_protocol
        if transport not in ("tcp", "both") or port == 0:
            return await original(self, host, port)
        servers = [await asyncio.start_server(self.handle_stream, host or None, port, reuse_port=True)]
        if transport == "both" and workerid.index() in (None, 1):
            servers.append(await self.start_udp_based_server(host or "0.0.0.0", port))
        return servers

    listen._ctp_reuse_port = True  # type: ignore[attr-defined]
    cls.listen = listen  # type: ignore[method-assign]
