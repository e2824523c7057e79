"""Writes the Responses body back once, after every addon of the chain had its turn."""

from __future__ import annotations

from mitmproxy import http

from proxy.flowbody import commit_body


class BodyWriter:
    def request(self, flow: http.HTTPFlow) -> None:
        commit_body(flow)


addons = [BodyWriter()]
