"""Per-flow state of the addon chain, kept beside the flow instead of in `flow.metadata`.

`flow.metadata` is deep-copied and serialized by mitmproxy's flow writer (`-w`, `--record`), which only
takes plain JSON-like values; parsed bodies, taps and identities live here, weakly keyed by the flow,
so they vanish with it. Use `state_of(flow)`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FlowState:
    body: Any = None  # proxy.flowbody.ResponsesBody, or UNPARSEABLE once parsing failed / did not apply
    body_checked: bool = False
    route: Any = None  # proxy.routes.Route
    session: Any = None  # proxy.session.SessionIdentity
    tap: Any = None  # proxy.sse.ResponseTap
    identity_headers: dict[str, str] = field(default_factory=dict)  # x-ctp-* as the client sent them
    extra: dict[str, Any] = field(default_factory=dict)  # other addons' per-flow data, by addon name


_states: weakref.WeakKeyDictionary[Any, FlowState] = weakref.WeakKeyDictionary()


def state_of(flow: Any) -> FlowState:
    st = _states.get(flow)
    if st is None:
        st = _states[flow] = FlowState()
    return st


def peek(flow: Any) -> FlowState | None:
    return _states.get(flow)
