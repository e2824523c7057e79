"""Flow helpers shared by the addons: route, session and tap lookups that also work standalone."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

from mitmproxy import http
from mitmproxy.proxy.mode_specs import ReverseMode

from proxy import routes
from proxy.app import runtime
from proxy.host.flowbody import responses_body
from proxy.host.flowstate import state_of
from proxy.session import AGENT_HEADER, TASK_HEADER, SessionIdentity, resolve_session
from proxy.upstream.relay import Offer, offer_of
from proxy.windows.request import WindowRequest


def is_reverse(flow: http.HTTPFlow) -> bool:
    return isinstance(flow.client_conn.proxy_mode, ReverseMode)


def destination_route(flow: http.HTTPFlow, trusted: bool) -> routes.Route:
    """The route of the request's current destination."""
    req = flow.request
    kind = routes.kind_of_path(req.path)
    official = routes.is_official_destination(req.scheme, req.host, req.port, req.path) is not None
    return routes.Route(kind=kind, official=official, trusted=trusted and not official)


def route_of(flow: http.HTTPFlow, trusted: bool) -> routes.Route:
    """The request's route: the routing stage's, or (an addon loaded alone) its current destination's."""
    route = state_of(flow).route
    return route if isinstance(route, routes.Route) else destination_route(flow, trusted)


def credentials_allowed(flow: http.HTTPFlow, route: routes.Route) -> bool:
    """The guard's rule (the one in proxy/routes.py) for a call to the request's own destination with its own
    credentials (a compaction, a checkpoint turn): a key of the wrong kind for that endpoint is refused as there."""
    req = flow.request
    return routes.may_receive_credentials(req.scheme, req.host, req.port, req.path, route, is_reverse(flow),
                                          header_pairs(flow))


def window_request(flow: http.HTTPFlow, rt: runtime.Runtime) -> WindowRequest | None:
    """The request side of the window service (proxy/windows/request.py), built once per request; None when the
    body is not a Responses request."""
    body = responses_body(flow)
    if body is None:
        return None
    return WindowRequest(rt, flow.request, body, state_of(flow), session_of(flow, rt.services.response_aliases),
                         route_of(flow, rt.upstream.trusted), is_reverse(flow), header_map(flow), header_pairs(flow))


def header_pairs(flow: http.HTTPFlow) -> tuple[tuple[str, str], ...]:
    """The request's headers as (name, value) pairs, repeated ones kept apart (what the credential rule reads),
    decoded from the raw fields once per version of them (see `header_map`)."""
    return _headers(flow)[1]


def header_map(flow: http.HTTPFlow) -> dict[str, str]:
    """The request's headers as a dict with lower-case names (repeated headers joined by ", ", as
    mitmproxy does), decoded straight from the raw fields: ≈5× cheaper than `dict(headers.items())`. Decoded once
    per version of the headers (five stages ask of every request); the dict is shared: never change it."""
    return _headers(flow)[2]


def _headers(flow: http.HTTPFlow) -> tuple[Any, tuple[tuple[str, str], ...], dict[str, str]]:
    fields = flow.request.headers.fields
    st = state_of(flow)
    memo = st.header_memo
    if memo is not None and memo[0] is fields:  # (mitmproxy replaces the fields tuple on every change)
        return memo
    pairs = tuple((raw_name.decode("utf-8", "surrogateescape"), raw_value.decode("utf-8", "surrogateescape"))
                  for raw_name, raw_value in fields)
    out: dict[str, str] = {}
    for raw, value in pairs:
        name = raw.lower()
        out[name] = f"{out[name]}, {value}" if name in out else value
    memo = st.header_memo = (fields, pairs, out)
    return memo


def credential_offer(flow: http.HTTPFlow, headers: Mapping[str, str], official: bool,
                     refused: str | None = None) -> Offer | None:
    """What the agent's model turn `flow` (as it is now) hands over to the tool server's credentials for its
    session (x-ctp-task / x-ctp-agent as the client sent them), or None: not a model turn, no task, no
    Authorization. The caller has already cleared the credentials for this destination."""
    req = flow.request
    if req.method != "POST" or "/responses" not in req.path.split("?", 1)[0]:
        return None  # only the agent's model turns (never, e.g., a call redirected to the tool server)
    ident = state_of(flow).identity_headers or {}
    task = ident.get(TASK_HEADER) or headers.get(TASK_HEADER)
    if not task:
        return None  # no task: nothing is handed over
    agent = ident.get(AGENT_HEADER) or headers.get(AGENT_HEADER)
    return offer_of(task, agent, req.scheme, req.host, req.port, req.path, headers, official, refused)


def session_of(flow: http.HTTPFlow, aliases: Mapping[str, str] | None) -> SessionIdentity | None:
    st = state_of(flow)
    if isinstance(st.session, SessionIdentity):
        return st.session
    body = responses_body(flow)
    if body is None:
        return None
    headers = header_map(flow)
    if st.identity_headers:  # x-ctp-* as the client sent them (stripped from the request)
        headers = {**headers, **st.identity_headers}
    ident = resolve_session(headers, body.view, aliases, fresh=flow.id)  # (reads a big input's first items only)
    st.session = ident
    return ident


Listener = Callable[[str, dict[str, Any]], None]


def weak_listener(flow: http.HTTPFlow, handler: Callable[[http.HTTPFlow, str, dict[str, Any]], None]) -> Listener:
    """A tap listener that reaches its flow weakly. The tap lives on the flow (its state and its stream
    callable), so a listener holding the flow would make a cycle: only the cycle collector could free the
    flow and its bodies, and a global map of states would pin it for good (issue 10.1). `handler` must not
    hold the flow either: pass a function or a bound method of the addon."""
    ref = weakref.ref(flow)

    def listener(typ: str, payload: dict[str, Any]) -> None:
        live = ref()
        if live is not None:
            handler(live, typ, payload)

    return listener
