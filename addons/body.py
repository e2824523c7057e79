"""Writes the Responses body back once, after every addon of the chain had its turn; answers a body that
inflated past `limits.max_body_bytes` with a 413 instead (proxy/host/flowbody.py)."""

from __future__ import annotations

from mitmproxy import http

from proxy.host.flowbody import commit_body, refuse_if_over_limit
from proxy.windows.notes.at_forward import at_forward


class BodyWriter:
    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is None:
            at_forward(flow)  # the session's prompt_cache_key, its forwarded tools (issue 47)
        if not refuse_if_over_limit(flow):
            commit_body(flow)


addons = [BodyWriter()]
