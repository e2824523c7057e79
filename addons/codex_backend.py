"""Answers Codex's history/notes backend calls with ctproxy's own tool server instead of the upstream.

A Codex build with the history/notes extension POSTs each of those tool calls to its provider's base URL,
`{base_url}/alpha/history/v2/<tool>` or `{base_url}/alpha/notes/v2/<tool>` (research/codex-protocol.md
§4.6). With the base URL pointing at ctproxy (`http://127.0.0.1:8787/v1`, or `…/backend-api/codex`), such
a request is redirected, in reverse mode, to the tool server's loopback address (the same path under
`/v1`, tools_server/codex_backend.py), after the agent's credential headers are taken off and the tool
server's bearer token (the state directory's `token` file) put on: the agent's OpenAI credentials never
reach the tool server, and the request never reaches the upstream. The route is marked trusted, so the
guard leaves that token alone: the destination is ctproxy's own process, not a third party.

The tool server's URL comes from the `ctp_tools_url` option (`ctproxy up` sets it); without one (`--no-tools`,
or a plain mitmdump without the option) these requests get a JSON 503 saying so. Loads alone:
`mitmdump -s addons/codex_backend.py --set ctp_tools_url=http://127.0.0.1:8788`.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit

from mitmproxy import ctx, http

from addons._flow import is_reverse
from addons._stage import Stage
from proxy import routes
from proxy.app import runtime
from proxy.errors import ProxyError
from proxy.host.flowstate import state_of

log = logging.getLogger("ctproxy.codex_backend")

OPTION = "ctp_tools_url"
# The client's path (Codex's base URL + alpha/…); a custom upstream's prefix is taken off first.
BACKEND_PATH = re.compile(r"^(/v1|/backend-api/codex)/alpha/(history|notes)/v2/([A-Za-z0-9_]{1,64})$")
# Credentials of the agent that must not travel on (Codex also sends its actor authorization).
_DROP = routes.CREDENTIAL_HEADERS | {"x-openai-actor-authorization"}


def backend_call(path: str, prefix: str = "") -> tuple[str, str, str] | None:
    """(client prefix, namespace, tool) of a Codex backend request path, else None."""
    p = path.split("?", 1)[0]
    if prefix and p.startswith(prefix):
        p = p[len(prefix):]
    m = BACKEND_PATH.match(p)
    return (m.group(1), m.group(2), m.group(3)) if m else None


class CodexBackend(Stage):
    _target: tuple[str, str, int, str] | None = None  # scheme, host, port, Host header of the tool server
    _token: str | None = None

    def load(self, loader) -> None:
        super().load(loader)
        if OPTION not in loader.master.options:  # also declared by the bridge stage: one declaration
            loader.add_option(OPTION, str, "", "the tool server's URL (set by `ctproxy up`)")

    def configure(self, updated: set[str]) -> None:
        super().configure(updated)
        if OPTION in updated:
            self._target = _parse(getattr(ctx.options, OPTION, "") or "")

    def bound(self, rt: runtime.Runtime) -> None:
        self._token = None  # another state directory: read its token on next use

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not is_reverse(flow) or flow.request.method != "POST":
            return
        upstream = self.rt.upstream
        call = backend_call(flow.request.path, "" if upstream.official else upstream.prefix)
        if call is None:
            return
        client_prefix, namespace, tool = call
        if self._target is None:
            err = ProxyError(503, "server_error", "tool_server_unavailable",
                             "ctproxy runs without its tool server (--no-tools), so it cannot answer Codex's "
                             f"{namespace} backend calls; start `ctproxy up` with the tool server")
            flow.response = http.Response.make(err.status, err.body(), err.headers())
            return
        if self._token is None:
            self._token = self.rt.state.token()
        req = flow.request
        for name in [k for k in req.headers if k.lower() in _DROP]:
            del req.headers[name]
        scheme, host, port, host_header = self._target
        req.scheme, req.host, req.port = scheme, host, port
        req.path = f"/v1/alpha/{namespace}/v2/{tool}"
        req.host_header = host_header
        req.headers["authorization"] = f"Bearer {self._token}"
        # ctproxy's own process, with its own token: the guard must not take that token off again.
        kind = "codex" if client_prefix == "/backend-api/codex" else "api"
        st = state_of(flow)
        st.route = routes.Route(kind=kind, official=False, trusted=True)
        st.to_tool_server = True  # the x-ctp-* headers name the caller there (addons/session.py keeps them)
        log.debug("codex backend call %s/%s → tool server", namespace, tool)  # names only, never arguments


def _parse(url: str) -> tuple[str, str, int, str] | None:
    if not url:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        log.warning("ignoring %s: not an http(s) URL", OPTION)
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname
    name = f"[{host}]" if ":" in host else host
    return parts.scheme, host, port, f"{name}:{port}"


addons = [CodexBackend()]
