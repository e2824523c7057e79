"""The request side of the window service (issue 29): one typed object per request, built once from the flow by
the stage that reads it (`addons/_flow.py` `window_request`), the way `WindowDeps` is for the process.

It carries what the roads of the context stage (proxy/windows/roads.py) read of a request: its body, the chain's
per-flow state, the session, the route and the credential verdict, the headers. The roads write only the body
(`body.replace`) and the context stage's own fields of the state (`window`, a decision derived from compaction's,
`context_rollover`, `checkpoint_mark`); the stage then writes the body back."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mitmproxy import http

from proxy import routes
from proxy.items.inputs import InputFacts
from proxy.items.lazyitems import is_item_list, plain_payload
from proxy.session import SessionIdentity
from proxy.windows import service
from proxy.windows.host import WindowHost

if TYPE_CHECKING:
    from proxy.journal import Journal, RequestMark
    from proxy.windows.decision import WindowDecision
from proxy.windows.notes.decorate import stateful_or_client
from proxy.windows.remote import journal_link


class RequestBody(Protocol):
    """The request's body as the window feature reads and rewrites it (the host's `ResponsesBody`,
    proxy/host/flowbody.py): parsed once for the whole chain, rewritten by `replace`."""

    view: dict[str, Any]  # as the stages left it; a big body's `input` may not be built yet
    source_bytes: int  # the client's body as parsed: its size

    @property
    def value(self) -> dict[str, Any]: ...

    def replace(self, new: dict[str, Any]) -> None: ...

    def facts(self, items: Any) -> InputFacts: ...


class RequestState(Protocol):
    """The chain's per-request fields the window feature reads (the journal, the session's mark, the identity
    headers) and writes (its decision, a mid-turn rollover, a checkpoint's mark): the host's `FlowState`."""

    journal: Journal | None
    identity_headers: dict[str, str]
    window: WindowDecision | None
    stored_usage: dict[str, Any] | None
    context_rollover: Any
    checkpoint_mark: RequestMark | None
    compaction: Any  # compaction's own record of the request (a FlowInfo), for overflow recovery

    @property
    def request_mark(self) -> RequestMark | None: ...


@dataclass(frozen=True)
class WindowRequest:
    """One request as the window service reads it. Never stored on the flow's state (it reaches the request)."""

    rt: WindowHost = field(repr=False)
    request: http.Request = field(repr=False)  # the destination and headers a compaction call reuses
    body: RequestBody = field(repr=False)
    state: RequestState = field(repr=False)
    ident: SessionIdentity | None
    route: routes.Route
    reverse: bool  # the proxy runs as a reverse proxy for this flow (the credential rule reads it)
    headers: Mapping[str, str] = field(repr=False)  # lower-case names (`_flow.header_map`): never change it
    pairs: tuple[tuple[str, str], ...] = field(repr=False)  # the headers as sent, repeated ones apart

    @functools.cached_property
    def credentials_allowed(self) -> bool:
        """The one credential rule (proxy/routes.py, the guard's) for a call to the request's own destination,
        asked only where a call is made."""
        req = self.request
        return routes.may_receive_credentials(req.scheme, req.host, req.port, req.path, self.route, self.reverse,
                                              self.pairs)

    @functools.cached_property
    def gateway_key(self) -> str | None:
        """A trusted gateway's own key for ctproxy's calls beside this request (`routes.gateway_key`)."""
        return routes.gateway_key(self.route, self.reverse, self.pairs, os.environ)

    @property
    def payload(self) -> dict[str, Any]:
        return self.body.view  # a big input is built only where it is rewritten

    @property
    def session_key(self) -> str | None:
        return self.ident.session_key if self.ident is not None else None

    def deps(self, journal: Any, tools: Any = None) -> service.WindowDeps:
        return service.deps_of(self.rt, self.route, self.credentials_allowed, journal, tools)

    def window_session(self, stateful: bool = False) -> journal_link.WindowSession | None:
        """The journal session whose windows apply: a stateless request (`stateful` False) or one chained by
        `previous_response_id` (True); None for the other kind, or without a session."""
        payload = self.body.view
        if stateful:
            if not payload.get("previous_response_id") or payload.get("conversation") is not None:
                return None
        elif stateful_or_client(payload, self.facts(payload)):
            return None
        if self.ident is None:
            return None
        st = self.state
        return journal_link.window_session(service.journal_of(self.rt, st.journal), st.request_mark, self.ident,
                                           lambda: {**self.headers, **st.identity_headers}, payload)

    def built(self, payload: dict[str, Any]) -> dict[str, Any]:
        """`payload` with its input items built: the body's own dict is built in place (so `payload`, when it is
        that dict, stays the same object), any other one is copied with the list."""
        self.body.value  # noqa: B018  (builds the body's input in place)
        return plain_payload(payload)

    def facts(self, payload: dict[str, Any]) -> InputFacts | None:
        """The one-pass facts of `payload`'s input list, cached on the body (None for a string input)."""
        items = payload.get("input")
        return self.body.facts(items) if is_item_list(items) else None
