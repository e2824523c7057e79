"""The credential boundary: credentials reach only the official endpoint of their kind.

Runs last before the request leaves. A request to anything but https://api.openai.com/v1/… or
https://chatgpt.com/backend-api/codex/… loses its credential headers, unless the user trusted that
upstream (`--trust-upstream`, reverse mode only). In regular (HTTPS proxy) mode the guard applies to
requests that carry OpenAI credentials or OpenAI API paths; other traffic is the client's business.

Kind matches host: a request to an official endpoint carrying the other kind of credential (an API key to
chatgpt.com/backend-api/codex, a ChatGPT OAuth token to api.openai.com/v1) never leaves; the client gets
a 403 OpenAI-style error saying which kind goes where (`credential_kind_mismatch`).

A Responses request let through with its credentials is offered to the credential relay
(`proxy/upstream/relay.py`): the tool server's image generation and sidecar search, called over MCP or
REST with the same x-ctp-task/x-ctp-agent, use that session's most recent credentials, toward the same
destination. Needs the tool server's URL (`ctp_tools_url`, set by `ctproxy up`); alone, nothing is relayed.
"""

from __future__ import annotations

import logging
import os

from mitmproxy import ctx, http

from addons._flow import credential_offer, destination_route, header_map, header_pairs, is_reverse
from addons._stage import Stage, close_later
from proxy import routes
from proxy.bridge.server import PATH_PREFIX as BRIDGE_PREFIX
from proxy.errors import ProxyError
from proxy.host.flowstate import state_of
from proxy.upstream.relay import CredentialRelay

log = logging.getLogger("ctproxy.guard")

_OPENAI_ONLY_HEADERS = frozenset({"chatgpt-account-id", "openai-organization", "openai-project"})


def _looks_openai(flow: http.HTTPFlow) -> bool:
    names = {k.lower() for k in flow.request.headers}
    if names & _OPENAI_ONLY_HEADERS:
        return True
    auth = flow.request.headers.get("authorization", "")
    if auth.lower().startswith("bearer sk-"):
        return True
    return routes.kind_of_path(flow.request.path) is not None


def strip_credentials(flow: http.HTTPFlow) -> int:
    """Take every credential off the request (the carriers of `routes.carried_credentials`): the credential
    headers, the query's key parameters, the subprotocols that carry a key. Returns how many were taken."""
    req = flow.request
    names = [k for k in req.headers if k.lower() in routes.CREDENTIAL_HEADERS]
    for name in names:
        del req.headers[name]
    removed = len(names)
    if (query := routes.query_credentials(req.path)):
        req.path = routes.without_query_credentials(req.path)
        removed += len(query)
    offered = req.headers.get(routes.PROTOCOL_HEADER)
    if offered is not None and (kept := routes.without_credential_protocols(offered)) != offered:
        removed += 1
        if kept:
            req.headers[routes.PROTOCOL_HEADER] = kept
        else:
            del req.headers[routes.PROTOCOL_HEADER]
    return removed


def refuse_mismatch(flow: http.HTTPFlow, why: str) -> None:
    """Answer locally: the request, and its credentials, never leave."""
    err = ProxyError(403, "invalid_request_error", "credential_kind_mismatch", why)
    flow.response = http.Response.make(err.status, err.body(), err.headers())
    # Host and category only: never headers, paths or values.
    log.info("guard: refused a credential of the wrong kind for %s", flow.request.host)


class Guard(Stage):
    _relay: CredentialRelay | None = None

    def bound(self, rt) -> None:
        # another state directory (token) or tool server: made again on next use; the old one's hand-overs in
        # flight finish and its connections close
        relay, self._relay = self._relay, None
        close_later(relay.close() if relay is not None else None)

    def relay(self) -> CredentialRelay | None:
        if self._relay is None:
            url = str(getattr(ctx.options, "ctp_tools_url", "") or "") if hasattr(ctx, "options") else ""
            if not url:
                return None
            self._relay = CredentialRelay(url, self.rt.state.token())
        return self._relay

    def _offer(self, flow: http.HTTPFlow, official: bool) -> None:
        # one pass over the raw fields (a mitmproxy `Headers.get` scans them all)
        offer = credential_offer(flow, header_map(flow), official)
        if offer is not None and (relay := self.relay()) is not None:
            relay.offer(offer)

    async def done(self) -> None:
        relay, self._relay = self._relay, None
        if relay is not None:
            await relay.close()  # lets hand-overs in flight finish, then closes its connections

    def request(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None:
            return  # answered locally; nothing leaves
        st = state_of(flow)
        if st.credential_offer is not None and (relay := self.relay()) is not None:
            relay.offer(st.credential_offer)  # the bridge took the credentials off this request: its hand-over
        st_route = state_of(flow).route
        # Alone (no routing addon), trust comes straight from the options (`--set ctp_trust_upstream=true`).
        route = st_route if st_route is not None else destination_route(
            flow, trusted=self.rt.upstream.trusted)
        # Re-check the destination as it is now: an addon may have changed it after routing.
        req = flow.request
        pairs = header_pairs(flow)
        if routes.may_receive_credentials(req.scheme, req.host, req.port, req.path, route, is_reverse(flow), pairs):
            official = routes.is_official_destination(req.scheme, req.host, req.port, req.path) is not None
            if official or route.trusted:
                self._offer(flow, official)
            self._gateway_key(flow, route, pairs)
            return
        if (why := routes.credential_mismatch(req.scheme, req.host, req.port, req.path, pairs)) is not None:
            refuse_mismatch(flow, why)
            return
        if not is_reverse(flow) and not _looks_openai(flow):
            return
        if (route.trusted and is_reverse(flow) and route.kind is not None and (relay := self.relay()) is not None
                and routes.credential_kind(routes.carried_credentials(req.path, pairs)) in ("chatgpt", "mixed")
                and routes.gateway_key(route, True, pairs, os.environ) is None
                and (refusal := credential_offer(flow, header_map(flow), False, "sign_in_to_gateway")) is not None):
            relay.offer(refusal)  # the session's tools are told why they have no credential (not which one)
        removed = strip_credentials(flow)
        if removed:
            # Host only: never headers, paths or values.
            log.info("guard: stripped %d credential(s) for non-official host %s", removed, req.host)
        self._gateway_key(flow, route, header_pairs(flow))

    def _gateway_key(self, flow: http.HTTPFlow, route: routes.Route, pairs) -> None:
        """A trusted gateway's own key (ctproxy's environment) on a request that has no key for it."""
        if flow.request.path.startswith(BRIDGE_PREFIX):
            return  # the bridge's loopback endpoint: its job carries the gateway key upstream itself
        if (key := routes.gateway_key(route, is_reverse(flow), pairs, os.environ)) is not None:
            strip_credentials(flow)
            flow.request.headers["authorization"] = f"Bearer {key}"
            self._offer(flow, False)  # the session's tools follow it to the gateway, with the gateway's key


addons = [Guard()]
