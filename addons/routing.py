"""Sends each request to its upstream and records its route.

Reverse mode with the official upstream: `/v1/…` → https://api.openai.com/v1/…, `/backend-api/codex/…`
→ https://chatgpt.com/backend-api/codex/…. With `--upstream URL`, every path goes to that origin (its
path prefix prepended). Regular (HTTPS proxy) mode keeps the client's destination.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from mitmproxy import http

from addons._flow import destination_route, is_reverse
from proxy import routes, runtime
from proxy.flowstate import state_of


class Routing:
    def load(self, loader) -> None:
        runtime.declare_options(loader)

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return
        # The client's bytes, before any addon changes them (kept by reference; recorded with --record).
        state_of(flow).extra["client_request"] = flow.request.raw_content
        upstream = runtime.current().upstream
        if is_reverse(flow):
            req = flow.request
            if upstream.official:
                kind = routes.kind_of_path(req.path)
                origin = routes.OFFICIAL_UPSTREAMS["codex" if kind == "codex" else "api"]
                prefix = ""
            else:
                origin, prefix = upstream.origin or "", upstream.prefix
            parts = urlsplit(origin)
            req.scheme = parts.scheme
            req.host = parts.hostname or req.host
            req.port = parts.port or (443 if parts.scheme == "https" else 80)
            if prefix:
                req.path = prefix + req.path
            default_port = 443 if req.scheme == "https" else 80
            req.host_header = req.host if req.port == default_port else f"{req.host}:{req.port}"
            route = destination_route(flow, trusted=upstream.trusted)
            if prefix:  # the route kind follows the client's path, not the gateway's prefix
                kind = routes.kind_of_path(req.path[len(prefix):])
                route = routes.Route(kind=kind, official=route.official, trusted=route.trusted)
            state_of(flow).route = route
        else:
            state_of(flow).route = destination_route(flow, trusted=False)


addons = [Routing()]
