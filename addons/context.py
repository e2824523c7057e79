"""The context stage (DESIGN §3.3, ADR 0006): applies the session's current window to the request.

The journal's windows are the only windows; the stage replaces the agent's items before the current
window's boundary by the window's bootstrap (`proxy/transforms/window.py`, a pure transform), when the
agent's items still start with what the window covers (the one hash chain); otherwise nothing is
replaced and the journal records why (`projection`/`diverged`).

In the chain it runs after compaction, which decides for the request (the checkpoint in effect, whether
its opaque item may be replayed, how far its bootstrap gives way) and may just have opened a new window:
this stage applies that decision. Without a compaction decision (loaded alone, `mitmdump -s
addons/context.py`) it finds the session's current window itself and applies its readable bootstrap
(an opaque item is replayed only where compaction has checked the fingerprint).

A strategy is one entry of `PROJECTIONS` (proxy/windows/projection.py, where the projection is decided).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from mitmproxy import ctx, http

from addons._flow import destination_route, header_map, is_reverse, session_of
from addons._stage import Stage
from proxy import dbworker, debuglog, routes, runtime
from proxy.compaction import journal_link
from proxy.context import checkpoint_turn as ckturn
from proxy.context.decorate import decorate, stateful_or_client
from proxy.context.rollover import RolloverStore
from proxy.flowbody import ResponsesBody, commit_if_alone, responses_body
from proxy.flowstate import state_of
from proxy.journal import Window
from proxy.store.interface import Store
from proxy.toolclient import ToolClient
from proxy.transforms.items import InputFacts, input_items
from proxy.transforms.lazyitems import is_item_list, plain_payload
from proxy.windows import budget, checkpoint, hard_trigger, notes_window, opening, projection, service
from proxy.windows import rollover_choice as choice
from proxy.windows.projection import project_decision

log = logging.getLogger("ctproxy.context")

REPORTED_WINDOWS = 4096  # windows whose divergence this process has recorded (once each)


class Context(Stage):
    def __init__(self) -> None:
        self._reported: OrderedDict[str, None] = OrderedDict()
        self._rollovers: RolloverStore | None = None
        self._tools: ToolClient | None = None
        self._spec: dict[str, Any] | None = None

    def load(self, loader: Any) -> None:
        super().load(loader)
        if "ctp_tools_url" not in loader.master.options:  # also declared by codex_backend and bridge: once
            loader.add_option("ctp_tools_url", str, "", "the tool server's URL (set by `ctproxy up`)")

    def bound(self, rt: runtime.Runtime) -> None:
        self._rollovers = None
        self._tools, self._spec = None, None

    def _notes_store(self) -> Store:
        return self.rt.state_store()

    def _store(self) -> RolloverStore:
        if self._rollovers is None:
            rt = self.rt
            store = rt.state_store()
            # A shared store (`--store postgresql://…`): marks made through any instance are taken from it.
            backend = store.rollovers if store.kind != "embedded" else None
            self._rollovers = RolloverStore(dbworker.shared(rt.services, rt.state.db_path), rt.state.db_path,
                                            backend=backend)
        return self._rollovers

    def request(self, flow: http.HTTPFlow) -> Awaitable[None] | None:
        if flow.response is not None:
            return None
        cfg = self.rt.config
        rc = cfg.remote_compaction
        if not (cfg.context.enabled or rc.enabled or cfg.recovers_overflow()):
            return None  # no strategy makes or applies windows: the body need not even be parsed
        if cfg.context.enabled:
            ws = self._window_session(flow)
            if ws is not None:  # a stateless request of a known session: it may roll over
                return self._with_rollover(flow, ws)
            ws = self._stateful_session(flow)
            if ws is not None:  # the upstream holds the history: a pending new_context starts a new chain
                self._offer_midturn(flow, ws, responses_body(flow).view, stateful=True)  # type: ignore[union-attr]
                if self._may_be_pending(ws):
                    return self._stateful_rollover(flow, ws)
        self._project(flow, None, None)
        return None

    # ------------------------------------------------------------------ stateful clients (issue 29 (2))
    def _may_be_pending(self, ws: journal_link.WindowSession) -> bool:
        """A rollover may be pending for the session (the stamp says so without the database thread)."""
        try:
            return self._store().may_be_pending(ws.task_id, ws.address)
        except Exception:  # the state database is a record here: never a reason to fail the request
            log.warning("context: could not read the pending rollover of a session")
            return False

    def _stateful_session(self, flow: http.HTTPFlow) -> journal_link.WindowSession | None:
        """The journal session of a request chained by `previous_response_id` that may roll over: a rollover
        may be pending, or the bridge runs `new_context` in its turn; else None."""
        body = responses_body(flow)
        if body is None:
            return None
        payload = body.view
        if not payload.get("previous_response_id") or payload.get("conversation") is not None:
            return None
        ident = session_of(flow, self.rt.services.response_aliases)
        if ident is None:
            return None
        st = state_of(flow)
        ws = journal_link.window_session(service.journal_of(self.rt, st.journal), st.journal_mark, ident,
                                         lambda: {**header_map(flow), **st.identity_headers}, payload)
        if ws is None or not ("context" in self.rt.config.bridge.families or self._may_be_pending(ws)):
            return None
        return ws

    async def _stateful_rollover(self, flow: http.HTTPFlow, ws: journal_link.WindowSession) -> None:
        """A pending `new_context` for a client that chains by `previous_response_id`: the id is dropped and
        the request goes up as the new window's bootstrap plus the agent's new messages (its outputs for the
        previous answer's calls close the old window). The answer's id then chains in the new window: the
        upstream stored that input, so the agent's next `previous_response_id` continues there."""
        try:
            pending = await self._store().take(ws.task_id, ws.address, choice.ROLLOVER_KINDS)
        except Exception:
            log.warning("context: could not read the pending rollover of a session")
            pending = None
        body = responses_body(flow)
        if pending is None or body is None:
            self._project(flow, None, None)
            return
        out = await notes_window.stateful_rollover(self._notes_store(), ws, state_of(flow).journal_mark, body.value,
                                                   self.rt.config.bridge.families, pending.kind)
        if out is None:
            self._project(flow, None, None)
            return
        body.replace(out)
        commit_if_alone(flow)

    def _with_rollover(self, flow: http.HTTPFlow, ws: journal_link.WindowSession) -> Awaitable[None] | None:
        """The session's pending rollover, consumed at this request (whatever it holds: only
        terminating calls, a mixed batch, a steer or a follow-up), then the projection. A manual
        checkpoint, or the hard trigger, runs the checkpoint turn first (strategy `notes`); under strategy
        `remote` / `fallback` both compact instead. Synchronous when nothing is pending (the stamp says so
        without the database thread) and the hard trigger is not reached: nearly every request."""
        body = responses_body(flow)
        payload = body.view if body is not None else {}  # a big input is built only where it is rewritten
        self._offer_midturn(flow, ws, payload)
        can_turn = self._can_checkpoint(payload)
        strategy = self.rt.config.context.strategy
        kinds = choice.pending_kinds(strategy, self._tools_client() is not None)
        try:
            maybe = self._store().may_be_pending(ws.task_id, ws.address)
        except Exception:  # the state database is a record here: never a reason to fail the request
            log.warning("context: could not read the pending rollover of a session")
            maybe = False
        if maybe:
            return self._take_and_roll(flow, ws, payload, can_turn, strategy, kinds)
        kind = self._threshold(flow, ws, payload, can_turn, strategy)
        if kind is not None:
            return self._roll(flow, ws, payload, kind, strategy)
        self._project(flow, ws, None)
        return None

    async def _take_and_roll(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                             can_turn: bool, strategy: str, kinds: tuple[str, ...]) -> None:
        try:
            pending = await self._store().take(ws.task_id, ws.address, kinds)
        except Exception:  # the state database is a record here: never a reason to fail the request
            log.warning("context: could not read the pending rollover of a session")
            pending = None
        kind = pending.kind if pending is not None else self._threshold(flow, ws, payload, can_turn, strategy)
        await self._roll(flow, ws, payload, kind, strategy)

    def _threshold(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                   can_turn: bool, strategy: str) -> str | None:
        return choice.trigger_kind(can_turn, strategy, (can_turn or strategy != "notes")
                                   and self._hard(flow, ws, payload))

    async def _roll(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                    kind: str | None, strategy: str) -> None:
        if choice.compacts_first(kind, strategy):
            done = await self._compact(flow, ws, kind, remote=strategy == "remote")
            journal_link.record_event(ws, "hard_trigger" if kind == "threshold" else "manual_checkpoint",
                                      {"strategy": strategy, "outcome": done})
            debuglog.event("context", phase=kind, strategy=strategy, outcome=done)
            if done != "none":
                return
            kind = choice.after_compaction(kind, done)
        if kind is not None and choice.runs_turn(kind):
            payload = _built(flow, payload)
            outcome, executed = await self._checkpoint_turn(flow, ws, payload)
            self._journal_turn(flow, ws, payload, executed)
            journal_link.record_event(ws, "checkpoint_turn", {"outcome": outcome, "reason": kind})
            debuglog.event("context", outcome="checkpoint_turn", result=outcome, reason=kind)
            then = choice.after_turn(kind, outcome)
            if then == "keep":  # seed 000: an unsaved manual checkpoint keeps the current window
                journal_link.record_event(ws, "manual_checkpoint", {"outcome": "kept_window", "reason": outcome})
                self._project(flow, ws, None)
                return
            if then == "compact":
                if await self._compact(flow, ws, kind, remote=True) != "none":
                    return
                kind = f"{kind}_failed"  # nothing to compact: a notes window all the same
        body = responses_body(flow)
        opened = notes_window.roll_over(self._notes_store(), ws, state_of(flow).journal_mark,
                                        body.value if body is not None else None, self.rt.config.bridge.families,
                                        kind) if kind is not None else None
        self._project(flow, ws, opened)

    # ------------------------------------------------------------------ compaction at the hard trigger
    def _route(self, flow: http.HTTPFlow) -> routes.Route:
        route = state_of(flow).route
        if isinstance(route, routes.Route):
            return route
        return destination_route(flow, trusted=self.rt.upstream.trusted)

    def _credentials_allowed(self, flow: http.HTTPFlow, route: routes.Route) -> bool:
        """The one credential rule (the guard's) for a call to the request's own destination."""
        req = flow.request
        return routes.may_receive_credentials(req.scheme, req.host, req.port, req.path, route, is_reverse(flow),
                                              req.headers.items(multi=True))

    async def _compact(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, kind: str,
                       remote: bool) -> str:
        """The compaction at a rollover (proxy/windows/hard_trigger.py); returns the strategy made, or `none`."""
        body = responses_body(flow)
        if body is None:
            return "none"
        rt = self.rt
        st = state_of(flow)
        route = self._route(flow)
        ident = session_of(flow, rt.services.response_aliases)
        done = await hard_trigger.compact_at_rollover(
            rt, ws, body.value, st.window, kind, remote, route, self._credentials_allowed(flow, route), flow.request,
            header_map(flow), ident.session_key if ident is not None else None)
        if done.decision is not None:
            st.window = done.decision
        if done.forwarded is not None and done.forwarded is not body.value:
            body.replace(done.forwarded)
            commit_if_alone(flow)
        return done.strategy

    # ------------------------------------------------------------------ the checkpoint turn
    def _tools_client(self) -> ToolClient | None:
        if self._tools is None:
            try:
                url = str(getattr(ctx.options, "ctp_tools_url", "") or "")
            except AttributeError:  # no mitmproxy master (a unit test): no tool server to call
                url = ""
            if url:
                self._tools = ToolClient(url, self.rt.state.token(),
                                         timeout=self.rt.config.context.checkpoint_timeout_seconds)
        return self._tools

    def _can_checkpoint(self, payload: dict[str, Any]) -> bool:
        """The turn needs the agent's own-notes write tool (reachable) and the tool server that runs it."""
        return ckturn.WRITE_TOOL in reachable_context_tools(payload, self.rt) and self._tools_client() is not None

    def _hard(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any]) -> bool:
        used = self._usage_ratio(flow, ws, payload, self.rt.config.context.hard_ratio)
        return hard_trigger.hard_due(used, ws.journal.window_of(ws.key), input_items(payload) or [])

    async def _checkpoint_turn(self, flow: http.HTTPFlow, ws: journal_link.WindowSession,
                               payload: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """The checkpoint turn (proxy/windows/checkpoint.py) for this request, in its current window."""
        rt = self.rt
        client = self._tools_client()
        if client is None:
            return "no_tool_server", []

        def forwarded() -> dict[str, Any]:  # the request as it would go up now, in its current window
            return decorate(payload, self._forward_of(flow, ws, payload, None), ws, rt.config.bridge.families,
                            rt.config.context.id_projection, None)

        route = self._route(flow)
        deps = service.deps_of(rt, route, self._credentials_allowed(flow, route), ws.journal, client)
        outcome, executed, self._spec = await checkpoint.run_for_request(deps, rt.config, flow.request, ws,
                                                                         forwarded, self._spec)
        return outcome, executed

    def _journal_turn(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                      executed: list[dict[str, Any]]) -> None:
        st = state_of(flow)
        mark = checkpoint.journal_turn(st.journal, ws, input_items(payload), executed)
        if mark is not None:
            st.journal_mark = mark

    def _window_session(self, flow: http.HTTPFlow) -> journal_link.WindowSession | None:
        body = responses_body(flow)
        if body is None or stateful_or_client(body.view, _facts(body, body.view)):
            return None
        rt = self.rt
        ident = session_of(flow, rt.services.response_aliases)
        if ident is None:
            return None
        st = state_of(flow)
        return journal_link.window_session(service.journal_of(rt, st.journal), st.journal_mark, ident,
                                           lambda: {**header_map(flow), **st.identity_headers}, body.view)

    # ------------------------------------------------------------------ a bridged new_context mid-turn
    def _offer_midturn(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                       stateful: bool = False) -> None:
        """Where the bridge runs `new_context` itself, its later rounds of this agent request roll over
        too: the bridge calls `st.context_rollover` after a round whose bridged new_context succeeded.
        `stateful`: the request chains by `previous_response_id` (its rounds too, until the rollover)."""
        if "context" not in self.rt.config.bridge.families:
            return
        items = input_items(payload)
        if items or stateful:  # the agent's items as sent: later stages make new lists, never edit this one
            state_of(flow).context_rollover = functools.partial(self._midturn, ws, items or [], stateful)

    async def _midturn(self, ws: journal_link.WindowSession, agent_items: list[Any], stateful: bool,
                       shown: Sequence[Mapping[str, Any]], payload: dict[str, Any]) -> dict[str, Any] | None:
        """The pending `new_context` consumed now: the notes window opens after the agent's items and what
        the turn showed so far, and the bridge's next round (`payload`) goes up in it, stateless from there
        (a stateful round would continue the old window upstream). None: nothing pending."""
        try:
            pending = await self._store().take(ws.task_id, ws.address, choice.ROLLOVER_KINDS)
        except Exception:  # the state database is a record: the next agent request rolls over instead
            log.warning("context: could not read the pending rollover of a session")
            return None
        if pending is None:
            return None
        return await notes_window.open_midturn(self._notes_store(), ws, agent_items, stateful, shown, payload,
                                               self.rt.config.bridge.families, pending.kind)

    def _project(self, flow: http.HTTPFlow, ws: journal_link.WindowSession | None, opened: Window | None) -> None:
        body = responses_body(flow)
        if body is None:
            return
        payload = body.view
        out = self._forward_of(flow, ws, payload, opened)
        if ws is not None:
            cfg = self.rt.config
            out = decorate(payload, out, ws, cfg.bridge.families, cfg.context.id_projection,
                           self._reminder(flow, ws, payload, opened), _facts(body, out))
            self._first_estimate(flow, ws, body, out)
        if out is not payload:
            body.replace(out)
            commit_if_alone(flow)

    def _forward_of(self, flow: http.HTTPFlow, ws: journal_link.WindowSession | None, payload: dict[str, Any],
                    opened: Window | None) -> dict[str, Any]:
        """The window applied: compaction's decision, or the session's current window (`opened` now)."""
        info = state_of(flow).window
        if opened is None and info is not None and info.checkpoint is not None:
            return project_decision(_built(flow, payload), info)  # compaction decided: apply that
        return projection.current(self.rt, payload, ws, info is not None, opened,
                                  lambda: self._window_session(flow), lambda p: _built(flow, p), self._report)

    def _first_estimate(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, body: ResponsesBody,
                        out: dict[str, Any]) -> None:
        """A session's first request: its budget is an estimate of this request (proxy/windows/budget.py)."""
        rt = self.rt
        ident = session_of(flow, rt.services.response_aliases)
        if ident is None or rt.services.usage.get(ident.session_key) is not None:
            return
        source = body.source_bytes if out is body.view else None
        budget.first_estimate(rt.services, rt.state.db_path, ident.session_key, ws.task_id, ws.address,
                              state_of(flow).window, out, source)

    def _reminder(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                  opened: Window | None) -> tuple[int, int] | None:
        if opened is not None:
            return None  # this request starts a new window: the last usage was the old window's
        return self._usage_ratio(flow, ws, payload, self.rt.config.context.reminder_ratio)

    def _usage_ratio(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                     ratio: float) -> tuple[int, int] | None:
        rt = self.rt
        ident = session_of(flow, rt.services.response_aliases)
        u = rt.services.usage.get(ident.session_key) if ident is not None else None
        if u is None:
            return None
        return hard_trigger.usage_ratio(u, payload.get("model"), rt.config.model_windows, ratio,
                                        lambda: ws.journal.window_of(ws.key))

    def done(self) -> Awaitable[None] | None:
        rt = self._rt
        if rt is not None and rt.services.journal is not None:  # the divergences recorded, loaded alone too
            rt.services.journal.flush(timeout=30)
        if rt is not None and self._rollovers is not None:
            self._rollovers = None
            dbworker.close_shared(rt.services)
        tools, self._tools = self._tools, None
        return tools.close() if tools is not None else None  # the tool server's HTTP session

    def _report(self, ws: journal_link.WindowSession, w: Window) -> None:
        """The agent's items no longer start with what the window covers: said once per window."""
        key = f"{ws.key}\x00{w.window_id}"
        if key in self._reported:
            return
        self._reported[key] = None
        while len(self._reported) > REPORTED_WINDOWS:
            self._reported.popitem(last=False)
        journal_link.record_event(ws, "projection", {"outcome": "diverged", "window_id": w.window_id,
                                                     "strategy": w.strategy})


def _built(flow: http.HTTPFlow, payload: dict[str, Any]) -> dict[str, Any]:
    """`payload` with its input items built: the body's own dict is built in place (so `payload`, when it is that
    dict, stays the same object), any other one is copied with the list."""
    body = responses_body(flow)
    if body is not None:
        body.value  # noqa: B018  (builds the body's input in place)
    return plain_payload(payload)


def _facts(body: ResponsesBody, payload: dict[str, Any]) -> InputFacts | None:
    """The one-pass facts of `payload`'s input list, cached on the body (None for a string input)."""
    items = payload.get("input")
    return body.facts(items) if is_item_list(items) else None


def reachable_context_tools(payload: dict[str, Any], rt: runtime.Runtime) -> tuple[str, ...]:
    """The context tools the session can call (proxy/windows/opening.py)."""
    return opening.reachable_context_tools(payload, rt.config.bridge.families)




addons = [Context()]
