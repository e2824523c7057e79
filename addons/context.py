"""The context stage (DESIGN §3.3, ADR 0006): applies the session's current window to the request.

The journal's windows are the only windows; the stage replaces the agent's items before the current
window's boundary by the window's bootstrap (`proxy/windows/apply.py`, a pure transform), when the
agent's items still start with what the window covers (the one hash chain); otherwise nothing is
replaced and the journal records why (`projection`/`diverged`).

In the chain it runs after compaction, which decides for the request (the checkpoint in effect, whether
its opaque item may be replayed, how far its bootstrap gives way) and may just have opened a new window:
this stage applies that decision. Without a compaction decision (loaded alone, `mitmdump -s
addons/context.py`) it finds the session's current window itself and applies its readable bootstrap
(an opaque item is replayed only where compaction has checked the fingerprint).

A strategy is one entry of `PROJECTIONS` (proxy/windows/projection.py, where the projection is decided). The
roads (a pending rollover, the hard trigger, the checkpoint turn, a stateful chain, a bridged `new_context`
mid-turn) are the window service's (proxy/windows/roads.py): this stage reads the flow into one
`WindowRequest`, calls them, and writes the body back.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from mitmproxy import ctx, http

from addons._flow import window_request
from addons._stage import Stage, close_later
from proxy.app import runtime
from proxy.host.flowbody import commit_if_alone
from proxy.windows.request import WindowRequest
from proxy.windows.roads import ContextRoads


class Context(Stage):
    def __init__(self) -> None:
        self._roads: ContextRoads | None = None

    def load(self, loader: Any) -> None:
        super().load(loader)
        if "ctp_tools_url" not in loader.master.options:  # also declared by codex_backend and bridge: once
            loader.add_option("ctp_tools_url", str, "", "the tool server's URL (set by `ctproxy up`)")

    def bound(self, rt: runtime.Runtime) -> None:
        roads = self._roads
        if roads is None or roads.rt is rt:
            return  # the same runtime (an unrelated option changed): its roads stay
        self._roads = None  # another runtime: new roads on next use; the old ones close (tool client, database thread)
        close_later(roads.close())

    def roads(self) -> ContextRoads:
        if self._roads is None:
            self._roads = ContextRoads(self.rt, _tools_url)
        return self._roads

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response is not None:
            return None
        cfg = self.rt.config
        if not (cfg.context.enabled or cfg.remote_compaction.enabled or cfg.recovers_overflow()):
            return None  # no strategy makes or applies windows: the body need not even be parsed
        r = window_request(flow, self.rt)
        if r is None:
            return None
        pending = self.roads().request(r)  # None: done synchronously (nearly every request)
        if pending is not None:
            return self._then_commit(flow, r, pending)
        _commit(flow, r)
        return None

    async def _then_commit(self, flow: http.HTTPFlow, r: WindowRequest, pending: Awaitable[None]) -> None:
        await pending
        _commit(flow, r)

    def done(self) -> Awaitable[None] | None:
        rt = self._rt
        if rt is not None and rt.services.journal is not None:  # the divergences recorded, loaded alone too
            rt.services.journal.flush(timeout=30)
        roads, self._roads = self._roads, None
        return roads.close() if roads is not None else None


def _commit(flow: http.HTTPFlow, r: WindowRequest) -> None:
    if r.body.changed:  # loaded alone, the stage writes the body itself; in the chain the body writer does
        commit_if_alone(flow)


def _tools_url() -> str:
    try:
        return str(getattr(ctx.options, "ctp_tools_url", "") or "")
    except AttributeError:  # no mitmproxy master (a unit test): no tool server to call
        return ""


addons = [Context()]
