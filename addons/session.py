"""Resolves which task, agent and session a Responses request belongs to; strips `x-ctp-*` headers.

Order of signals: x-ctp-task / x-ctp-agent, Codex session headers, prompt_cache_key,
previous_response_id (through the journal's response aliases), else a fingerprint of the
instructions and the first input item.
"""

from __future__ import annotations

from mitmproxy import http

from proxy import runtime
from proxy.flowbody import responses_body
from proxy.flowstate import state_of
from proxy.session import resolve_session


def strip_ctp_headers(flow: http.HTTPFlow) -> None:
    for name in [k for k in flow.request.headers if k.lower().startswith("x-ctp-")]:
        del flow.request.headers[name]


class Session:
    def load(self, loader) -> None:
        runtime.declare_options(loader)

    def request(self, flow: http.HTTPFlow) -> None:
        st = state_of(flow)
        body = responses_body(flow)
        if body is not None:
            aliases = runtime.current().extras.get("response_aliases")
            st.session = resolve_session(dict(flow.request.headers.items()), body.value, aliases)
        # Identity headers are ours: they never go upstream. Later addons read the flow state.
        st.identity_headers = {k.lower(): v for k, v in flow.request.headers.items()
                               if k.lower().startswith("x-ctp-")}
        strip_ctp_headers(flow)


addons = [Session()]
