"""Per-flow state of the addon chain, kept on the flow object itself instead of in `flow.metadata`.

`flow.metadata` is deep-copied and serialized by mitmproxy's flow writer (`-w`, `--record`), which only
takes plain JSON-like values; parsed bodies, taps and identities live here instead. The state is an
attribute of the flow (not a value in a global map keyed by the flow): whatever the state refers to, it
can never keep its own flow alive — a `WeakKeyDictionary` value that reaches its key (a tap listener
closing over the flow did) pins the flow, its bodies and its answer for the life of the process
(issue 10.1). Use `state_of(flow)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_ATTR = "_ctp_state"  # not a field of mitmproxy's Flow: get_state()/copy() and the flow writer never see it


@dataclass
class FlowState:
    body: Any = None  # proxy.flowbody.ResponsesBody, or UNPARSEABLE once parsing failed / did not apply
    body_checked: bool = False
    route: Any = None  # proxy.routes.Route
    session: Any = None  # proxy.session.SessionIdentity
    tap: Any = None  # proxy.sse.ResponseTap
    identity_headers: dict[str, str] = field(default_factory=dict)  # x-ctp-* as the client sent them
    extra: dict[str, Any] = field(default_factory=dict)  # other addons' per-flow data, by addon name


def state_of(flow: Any) -> FlowState:
    try:
        return flow.__dict__[_ATTR]
    except KeyError:
        st = flow.__dict__[_ATTR] = FlowState()
        return st
