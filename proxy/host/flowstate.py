"""Per-flow state of the addon chain, kept on the flow object itself instead of in `flow.metadata`.

`flow.metadata` is deep-copied and serialized by mitmproxy's flow writer (`-w`, `--record`), which only
takes plain JSON-like values; parsed bodies, taps and identities live here instead. The state is an
attribute of the flow (not a value in a global map keyed by the flow): whatever the state refers to, it
can never keep its own flow alive — a `WeakKeyDictionary` value that reaches its key (a tap listener
closing over the flow did) pins the flow, its bodies and its answer for the life of the process
(issue 10.1). Use `state_of(flow)`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from proxy.windows.budget import ContextUsage  # (a leaf: the bridge imports it from there)

if TYPE_CHECKING:
    from proxy.journal import Journal, RequestMark
    from proxy.windows.decision import WindowDecision
    from proxy.windows.remote.flowinfo import FlowInfo

_ATTR = "_ctp_state"  # not a field of mitmproxy's Flow: get_state()/copy() and the flow writer never see it


class Settling:
    """A typed event: this flow's answer may still be replaced (a stage holds it, e.g. for overflow
    recovery). Stages that read answers do not read it now: they ask to be called once it is final
    (`when_settled`); the holding stage calls `settled()` when it is. Nobody re-runs another stage's hooks."""

    __slots__ = ("_callbacks",)

    def __init__(self) -> None:
        self._callbacks: list[Callable[[], object]] = []

    def when_settled(self, callback: Callable[[], object]) -> None:
        self._callbacks.append(callback)

    def settled(self) -> None:
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()


# context → bridge: given the items a bridged turn showed the agent so far and its next round's payload, the
# payload in the session's new window when a bridged `new_context` rolled it over mid-turn (else None).
ContextRollover = Callable[[Sequence[Mapping[str, Any]], dict[str, Any]], Awaitable[dict[str, Any] | None]]


@dataclass
class FlowState:
    """What the stages tell each other about one flow: typed fields, each written by one stage."""

    body: Any = None  # proxy.host.flowbody.ResponsesBody, or UNPARSEABLE once parsing failed / did not apply
    body_checked: bool = False
    body_limit: str | None = None  # flowbody: "passthrough" or "refused" when the body exceeded the limit
    body_limit_info: tuple[int, str, int] | None = None  # flowbody: (limit, encoding, compressed bytes)
    client_request: bytes | None = None  # routing: the client's own body, for replay matching
    route: Any = None  # proxy.routes.Route (routing)
    session: Any = None  # proxy.session.SessionIdentity (session_of)
    identity_headers: dict[str, str] = field(default_factory=dict)  # session: x-ctp-* as the client sent them
    to_tool_server: bool = False  # codex_backend: retargeted to ctproxy's own tool server (never upstream)
    tap: Any = None  # proxy.items.sse.ResponseTap (tap)
    journal: Journal | None = None  # history: the journal this request was written to
    journal_mark: RequestMark | None = None  # history: the journal's ids of this request's items
    agent_identity: tuple[str, str] | None = None  # history: (task, agent address) as the journal resolved it
    compaction: FlowInfo | None = None  # compaction: its own record of this request (for its response hooks)
    # the window service: the request's one window decision, made once by compaction's request hook; a later step
    # that changes the window stores a new one derived from it (dataclasses.replace), never edits it (ADR 0011)
    window: WindowDecision | None = None
    settling: Settling | None = None  # a stage holds the answer, which may still be replaced (see Settling)
    credential_offer: Any = None  # bridge: proxy.upstream.relay.Offer of the credentials it took off the request
    web_search: str | None = None  # web_search: why it did (or did not) inject the tool
    bridge_offered: int = 0  # bridge: how many tools it added to this request (the request log names the bridge)
    context_usage: ContextUsage | None = None  # bridge: the last round's usage of a bridged turn (see ContextUsage)
    stored_usage: dict[str, Any] | None = None  # usage: the stored usage read for this request (UsageCache.get's memo)
    gc_hold: Any = None  # flowbody: a proxy.gcpause.Hold while this flow's big parsed body is in flight
    context_rollover: ContextRollover | None = None  # context: a bridged new_context's rollover, mid-turn
    # context: the request's journal mark taken again after the checkpoint turn journaled its write before the
    # request's answer (history's `journal_mark` stays history's own; readers take `request_mark`)
    checkpoint_mark: RequestMark | None = None
    # _flow.header_pairs / header_map: the request's headers decoded once per version of them (the raw fields
    # tuple they were decoded from: mitmproxy replaces it on every change, so a stale copy is never read)
    header_memo: tuple[Any, tuple[tuple[str, str], ...], dict[str, str]] | None = None
    # body writer: the client's own values of the fields of its request ctproxy changed, for its answer
    # (proxy.host.clientecho.ClientEcho; None when the forwarded request has the client's own)
    echo: Any = None
    transport: str | None = None  # websocket: "ws" for a create (or an upgrade) of the Responses WebSocket mode
    logged_by: object | None = None  # requestlog: the request log that recorded this flow (once per flow)

    @property
    def request_mark(self) -> RequestMark | None:
        """The journal mark this request's answer follows: the checkpoint turn's (its write first), else history's."""
        return self.checkpoint_mark if self.checkpoint_mark is not None else self.journal_mark

    def release(self) -> None:
        """The exchange is over (every stage's last hook ran): drop what only the stages needed, so that
        reference counting frees it now. mitmproxy keeps a finished flow in reference cycles of its own
        layers until the cyclic collector runs; a parsed 1.5 MB body left on it made that collector free
        thousands of containers per request, at several times the cost of freeing them by reference
        counting (docs/benchmarks.md, session 5). `body_checked` stays set: a late reader finds no body
        rather than parsing it again."""
        self.body = None
        if self.gc_hold is not None:  # the body goes by reference counting now: the collector may run again
            self.gc_hold.close()
            self.gc_hold = None
        self.client_request = None
        self.tap = None
        self.journal_mark = None
        self.checkpoint_mark = None
        self.compaction = None
        self.window = None
        self.context_rollover = None  # (it holds the agent's items)


def release(flow: Any) -> None:
    """`FlowState.release` of a flow that has state (a flow no stage touched has none to drop)."""
    st = flow.__dict__.get(_ATTR)
    if st is not None and st.settling is None:  # a held answer is still being decided: nothing is over
        st.release()


def state_of(flow: Any) -> FlowState:
    try:
        return flow.__dict__[_ATTR]
    except KeyError:
        st = flow.__dict__[_ATTR] = FlowState()
        return st


def retap(flow: Any, resp: Any) -> None:
    """Refill the flow's tap from `resp` (an overflow recovery's retry, which replaced the answer), keeping the tap
    object (and its listeners)."""
    import orjson

    from proxy.items.sse import ResponseTap, StreamTap

    tap = state_of(flow).tap
    if not isinstance(tap, ResponseTap):
        return
    fresh = ResponseTap(listeners=tap.listeners)
    for name in ("response_id", "model", "status", "items", "usage", "error", "completed", "incomplete",
                 "events", "last_sequence", "first_output_seen"):
        setattr(tap, name, getattr(fresh, name))
    if resp.headers.get("content-type", "").lower().startswith("text/event-stream"):
        feeder = StreamTap(tap, resp.headers.get("content-encoding", ""))
        feeder(resp.raw_content or b"")
        feeder(b"")
    else:
        try:
            parsed = orjson.loads(resp.get_content(strict=False) or b"")
        except orjson.JSONDecodeError:
            return
        if isinstance(parsed, dict):
            tap.on_json_response(parsed)
