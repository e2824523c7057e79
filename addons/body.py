"""Writes the Responses body back once, after every addon of the chain had its turn; answers a body that
inflated past `limits.max_body_bytes` with a 413 instead (proxy/flowbody.py)."""

from __future__ import annotations

from mitmproxy import http

from proxy.flowbody import commit_body, refuse_if_over_limit


class BodyWriter:
    def request(self, flow: http.HTTPFlow) -> None:
        if not refuse_if_over_limit(flow):
            commit_body(flow)


addons = [BodyWriter()]
