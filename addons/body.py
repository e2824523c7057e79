"""Writes the Responses body back once, after every addon of the chain had its turn; answers a body that
inflated past `limits.max_body_bytes` with a 413 instead (proxy/host/flowbody.py).

Just before, the last step of a Responses create (issue 47): the session's derived `prompt_cache_key`
(proxy/windows/notes/cache_key.py: when the client sent none, `prompt_cache.derive_key` is on and a stage rewrote
the request anyway; a request no stage touched goes up byte for byte), and the forwarded `tools` and key
remembered for the session's checkpoint turn (proxy/windows/notes/last_tools.py)."""

from __future__ import annotations

from mitmproxy import http

from addons._stage import Stage
from proxy.app import runtime
from proxy.host.flowbody import ResponsesBody, commit_body, refuse_if_over_limit
from proxy.host.flowstate import state_of
from proxy.session import SessionIdentity
from proxy.windows.notes import cache_key


def at_forward(flow: http.HTTPFlow, rt: runtime.Runtime) -> None:
    st = state_of(flow)
    body, ident = st.body, st.session
    if not isinstance(body, ResponsesBody) or not isinstance(ident, SessionIdentity) or st.to_tool_server:
        return
    if rt.config.prompt_cache.derive_key and body.changed:  # an unchanged body goes up as the client's own bytes
        body.replace(cache_key.with_key(body.view, ident.session_key))
    rt.services.last_tools.remember(ident.session_key, body.view)


class BodyWriter(Stage):
    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is None:
            at_forward(flow, self.rt)
        if not refuse_if_over_limit(flow):
            commit_body(flow)


addons = [BodyWriter()]
