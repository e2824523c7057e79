"""Takes the `x-ctp-*` identity headers off a Responses request and keeps them for session resolution.

The headers are ours: they never go upstream (a Codex backend call retargeted to ctproxy's own tool
server keeps them: there they name the caller). This stage only moves them into the flow state; the
session itself (task / agent / session key) is resolved lazily by `addons._flow.session_of` on first
use, so a request no feature reads is never parsed. Its signals, in order: x-ctp-task / x-ctp-agent,
Codex session headers, prompt_cache_key, previous_response_id (through the journal's response aliases),
else a fingerprint of the instructions and the first input item.
"""

from __future__ import annotations

from mitmproxy import http

from addons._stage import Stage
from proxy.host.flowstate import state_of

CTP_PREFIX = b"x-ctp-"


def has_ctp_headers(flow: http.HTTPFlow) -> bool:
    # On the raw header fields: mitmproxy's decoded views cost ≈4 µs per header, and most requests have none.
    return any(name[:6].lower() == CTP_PREFIX for name, _ in flow.request.headers.fields)


def strip_ctp_headers(flow: http.HTTPFlow) -> None:
    for name in [k for k in flow.request.headers if k.lower().startswith("x-ctp-")]:
        del flow.request.headers[name]


class Session(Stage):

    def request(self, flow: http.HTTPFlow) -> None:
        # Identity headers are ours: they never go upstream. The session itself is resolved on first
        # use (`session_of`), so a request no feature reads is never parsed.
        if not has_ctp_headers(flow):
            return
        st = state_of(flow)
        if st.to_tool_server:
            # Codex's backend call, retargeted to ctproxy's own tool server (addons/codex_backend.py): the
            # headers are the tool server's caller identity there, as on its REST routes; they stay.
            return
        st.identity_headers = {k.lower(): v for k, v in flow.request.headers.items()
                               if k.lower().startswith("x-ctp-")}
        strip_ctp_headers(flow)


addons = [Session()]
