"""Sends each request to its upstream and records its route.

Reverse mode with the official upstream: `/v1/…` → https://api.openai.com/v1/…, `/backend-api/codex/…`
→ https://chatgpt.com/backend-api/codex/…. With `--upstream URL`, every path goes to that origin (its
path prefix prepended). Regular (HTTPS proxy) mode keeps the client's destination.
"""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

from mitmproxy import http

from addons._flow import destination_route, is_reverse
from addons._stage import Stage
from proxy import routes
from proxy.host import httpstream, sendbatch
from proxy.host.flowstate import state_of


@functools.lru_cache(maxsize=16)
def _target(origin: str) -> tuple[str, str, int, str]:
    """scheme, host, port and Host header of an upstream origin."""
    parts = urlsplit(origin)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    default_port = 443 if parts.scheme == "https" else 80
    name = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets in Host
    return parts.scheme, host, port, name if port == default_port else f"{name}:{port}"


class Routing(Stage):
    def load(self, loader) -> None:
        super().load(loader)
        httpstream.install()  # JSON errors and upstream timeouts, also under a plain mitmdump
        sendbatch.install()  # one send per connection and loop turn

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        # The client's bytes, before any addon changes them (kept by reference; recorded with --record).
        state_of(flow).client_request = flow.request.raw_content
        upstream = self.rt.upstream
        if is_reverse(flow):
            req = flow.request
            if upstream.official:
                kind = routes.kind_of_path(req.path)
                origin = routes.OFFICIAL_UPSTREAMS["codex" if kind == "codex" else "api"]
                prefix = ""
            else:
                origin, prefix = upstream.origin or "", upstream.prefix
            scheme, host, port, host_header = _target(origin)
            # mitmproxy's setters rewrite the authority and Host each time (≈11 µs): only when different,
            # which in reverse mode to a custom upstream they never are.
            if req.scheme != scheme:
                req.scheme = scheme
            if req.host != host:
                req.host = host
            if req.port != port:
                req.port = port
            if prefix:
                req.path = prefix + req.path
            if req.host_header != host_header:
                req.host_header = host_header
            route = destination_route(flow, trusted=upstream.trusted)
            if prefix:  # the route kind follows the client's path, not the gateway's prefix
                kind = routes.kind_of_path(req.path[len(prefix):])
                route = routes.Route(kind=kind, official=route.official, trusted=route.trusted)
            state_of(flow).route = route
        else:
            state_of(flow).route = destination_route(flow, trusted=False)


addons = [Routing()]
