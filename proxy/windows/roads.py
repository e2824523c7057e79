"""The context stage's roads (issue 29: moved out of addons/context.py): what applies the session's window to one
request (`WindowRequest`), the stage only reading the flow, calling `ContextRoads.request` and writing the body
back.

Five roads: a stateless request of a known session (it may roll over: a pending rollover, or the hard trigger),
a request chained by `previous_response_id` (a pending rollover starts a new chain, issue 29 (2)), a bridged
`new_context` mid-turn (the bridge calls back), the rollover itself (compaction, the checkpoint turn, or a notes
window), and the projection every request ends with. The decisions are the service's (rollover_choice,
hard_trigger, checkpoint, notes_window, projection); this module strings them together per request."""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from proxy import dbworker, debuglog
from proxy.items.inputs import input_items
from proxy.journal import Window
from proxy.toolclient import ToolClient
from proxy.windows import budget, checkpoint, hard_trigger, notes_window, opening, prewarm, projection
from proxy.windows import rollover_choice as choice
from proxy.windows.decision import WindowDecision
from proxy.windows.host import WindowHost
from proxy.windows.notes import checkpoint_turn as ckturn
from proxy.windows.notes.decorate import decorate
from proxy.windows.notes.rollover import RolloverStore
from proxy.windows.projection import project_decision
from proxy.windows.remote import journal_link
from proxy.windows.request import WindowRequest

log = logging.getLogger("ctproxy.context")

REPORTED_WINDOWS = 4096  # windows whose divergence this process has recorded (once each)
WS = journal_link.WindowSession


class ContextRoads:
    """The context stage's per-process state (the rollover store, the tool client, the write tool's spec, the
    divergences said) and its roads. `tools_url()`: the tool server's URL, read when a client is first needed."""

    def __init__(self, rt: WindowHost, tools_url: Callable[[], str]) -> None:
        self.rt = rt
        self._tools_url = tools_url
        self._rollovers: RolloverStore | None = None
        self._tools: ToolClient | None = None
        self._spec: dict[str, Any] | None = None
        self._reported: OrderedDict[str, None] = OrderedDict()

    # ------------------------------------------------------------------ process state
    def store(self) -> RolloverStore:
        if self._rollovers is None:
            rt = self.rt
            store = rt.state_store()
            # A shared store (`--store postgresql://…`): marks made through any instance are taken from it.
            backend = store.rollovers if store.kind != "embedded" else None
            self._rollovers = RolloverStore(dbworker.shared(rt.services, rt.state.db_path), rt.state.db_path,
                                            backend=backend)
        return self._rollovers

    def tools(self) -> ToolClient | None:
        if self._tools is None:
            url = self._tools_url()
            if url:
                self._tools = ToolClient(url, self.rt.state.token(),
                                         timeout=self.rt.config.context.checkpoint_timeout_seconds)
        return self._tools

    def close(self) -> Awaitable[None] | None:
        if self._rollovers is not None:
            self._rollovers = None
            dbworker.close_shared(self.rt.services)
        tools, self._tools = self._tools, None
        return tools.close() if tools is not None else None  # the tool server's HTTP session

    def _may_be_pending(self, ws: WS) -> bool:
        """A rollover may be pending for the session (the stamp says so without the database thread)."""
        if ws.mark is not None and ws.mark.minted:
            return False  # a session and task this request opened: no agent could mark anything for them yet
        try:
            return self.store().may_be_pending(ws.task_id, ws.address)
        except Exception:  # the state database is a record here: never a reason to fail the request
            log.warning("context: could not read the pending rollover of a session")
            return False

    async def _take(self, ws: WS, kinds: tuple[str, ...]) -> Any:
        try:
            return await self.store().take(ws.task_id, ws.address, kinds)  # type: ignore[arg-type]
        except Exception:  # the state database is a record here: never a reason to fail the request
            log.warning("context: could not read the pending rollover of a session")
            return None

    # ------------------------------------------------------------------ the request
    def request(self, r: WindowRequest) -> Awaitable[None] | None:
        """Synchronous when nothing is pending (the stamp says so without the database thread) and the hard
        trigger is not reached: nearly every request."""
        if self.rt.config.context.enabled:
            ws = r.window_session()
            if ws is not None:  # a stateless request of a known session: it may roll over
                return self._stateless(r, ws)
            ws = r.window_session(stateful=True)
            if ws is not None and ("context" in self.rt.config.bridge.families or self._may_be_pending(ws)):
                self._offer_midturn(r, ws, r.payload, stateful=True)  # the upstream holds the history
                if self._may_be_pending(ws):
                    return self._stateful_rollover(r, ws)
        self.project(r, None, None)
        return None

    async def _stateful_rollover(self, r: WindowRequest, ws: WS) -> None:
        """A pending rollover for a client that chains by `previous_response_id`: the id is dropped and the
        request goes up as the new window's bootstrap plus the agent's new messages (its outputs for the
        previous answer's calls close the old window). The answer's id then chains in the new window: the
        upstream stored that input, so the agent's next `previous_response_id` continues there. A manual
        checkpoint under strategy `notes` runs the checkpoint turn first, on the upstream's chain (the id kept:
        the upstream holds the window); an unsaved one keeps the window (seed 000). Under `remote` / `fallback`
        it rolls over at once: the request holds no items to compact."""
        strategy = self.rt.config.context.strategy
        pending = await self._take(ws, choice.pending_kinds(strategy, self.tools() is not None))
        out = None
        if pending is not None and pending.kind == "checkpoint" and strategy == "notes":
            payload = r.built(r.payload)
            outcome, executed = await self._checkpoint_turn(r, ws, payload, chained=True)
            self._journal_turn(r, ws, payload, executed, outcome, "checkpoint")
            if choice.after_turn("checkpoint", outcome) == "keep":
                journal_link.record_event(ws, "manual_checkpoint", {"outcome": "kept_window", "reason": outcome})
                pending = None
        if pending is not None:
            out = await notes_window.stateful_rollover(self.rt.state_store(), ws, r.state.request_mark, r.body.value,
                                                       self.rt.config.bridge.families, pending.kind)
        if out is None:
            self.project(r, None, None)
        else:
            r.body.replace(out)

    def _stateless(self, r: WindowRequest, ws: WS) -> Awaitable[None] | None:
        """The session's pending rollover, consumed at this request (whatever it holds: only terminating calls,
        a mixed batch, a steer or a follow-up), then the projection. A manual checkpoint, or the hard trigger,
        runs the checkpoint turn first (strategy `notes`); under `remote` / `fallback` both compact instead."""
        payload = r.payload
        self._offer_midturn(r, ws, payload)
        strategy = self.rt.config.context.strategy
        if self._may_be_pending(ws):
            return self._take_and_roll(r, ws, payload, strategy)
        kind = self._threshold(r, ws, payload, strategy)
        if kind is not None:
            return self._roll(r, ws, payload, kind, strategy)
        self.project(r, ws, None)
        return None

    async def _take_and_roll(self, r: WindowRequest, ws: WS, payload: dict[str, Any], strategy: str) -> None:
        pending = await self._take(ws, choice.pending_kinds(strategy, self.tools() is not None))
        kind = pending.kind if pending is not None else self._threshold(r, ws, payload, strategy)
        await self._roll(r, ws, payload, kind, strategy)

    def _threshold(self, r: WindowRequest, ws: WS, payload: dict[str, Any], strategy: str) -> str | None:
        can_turn = self._can_checkpoint(payload)
        return choice.trigger_kind(can_turn, strategy, (can_turn or strategy != "notes")
                                   and self._hard(r, ws, payload))

    async def _roll(self, r: WindowRequest, ws: WS, payload: dict[str, Any], kind: str | None, strategy: str) -> None:
        if choice.compacts_first(kind, strategy):
            done = await self._compact(r, ws, kind, remote=strategy == "remote")  # type: ignore[arg-type]
            journal_link.record_event(ws, "hard_trigger" if kind == "threshold" else "manual_checkpoint",
                                      {"strategy": strategy, "outcome": done})
            debuglog.event("context", phase=kind, strategy=strategy, outcome=done)
            if done != "none":
                await self._prewarm(r, ws, None)
                return
            kind = choice.after_compaction(kind, done)
        if kind is not None and choice.runs_turn(kind):
            payload = r.built(payload)
            outcome, executed = await self._checkpoint_turn(r, ws, payload)
            self._journal_turn(r, ws, payload, executed, outcome, kind)
            then = choice.after_turn(kind, outcome)
            if then == "keep":  # seed 000: an unsaved manual checkpoint keeps the current window
                journal_link.record_event(ws, "manual_checkpoint", {"outcome": "kept_window", "reason": outcome})
                self.project(r, ws, None)
                return
            if then == "compact":
                if await self._compact(r, ws, kind, remote=True) != "none":
                    await self._prewarm(r, ws, None)
                    return
                kind = f"{kind}_failed"  # nothing to compact: a notes window all the same
        opened = notes_window.roll_over(self.rt.state_store(), ws, r.state.request_mark, r.body.value,
                                        self.rt.config.bridge.families, kind) if kind is not None else None
        self.project(r, ws, opened)
        if opened is not None:
            await self._prewarm(r, ws, opened.window_id)

    async def _prewarm(self, r: WindowRequest, ws: WS, window_id: str | None) -> None:
        """The window just opened: its bootstrap pre-warmed in the upstream's cache (proxy/windows/prewarm.py)."""
        rt = self.rt
        if not rt.config.prompt_cache.prewarm or not prewarm.supports(r.body.view.get("model")):
            return
        try:
            if window_id is None:
                w = ws.journal.window_of(ws.key)
                window_id = w.window_id if w is not None else ""
            head = rt.services.last_tools.get(r.session_key) if r.session_key is not None else None
            await prewarm.prewarm(r.deps(ws.journal), rt.config, r.request, ws, window_id, r.body.view, head,
                                  rt.state.db_path, rt.services)
        except Exception:  # a cold cache, never a failed request
            log.warning("context: pre-warming the new window failed", exc_info=True)

    async def _compact(self, r: WindowRequest, ws: WS, kind: str, remote: bool) -> str:
        """The compaction at a rollover (proxy/windows/hard_trigger.py); returns the strategy made, or `none`."""
        done = await hard_trigger.compact_at_rollover(self.rt, ws, r.body.value, r.state.window, kind, remote,
                                                      r.route, r.credentials_allowed, r.request, r.headers,
                                                      r.session_key, r.gateway_key)
        if done.decision is not None:
            r.state.window = done.decision  # derived from compaction's decision, never edited (ADR 0011)
        if done.forwarded is not None and done.forwarded is not r.body.value:
            r.body.replace(done.forwarded)
        return done.strategy

    # ------------------------------------------------------------------ the checkpoint turn
    def _can_checkpoint(self, payload: dict[str, Any]) -> bool:
        """The turn needs the agent's own-notes write tool (reachable) and the tool server that runs it."""
        reachable = opening.reachable_context_tools(payload, self.rt.config.bridge.families)
        return ckturn.WRITE_TOOL in reachable and self.tools() is not None

    def _hard(self, r: WindowRequest, ws: WS, payload: dict[str, Any]) -> bool:
        """The one rule with compaction: this request's estimate (the decision's), not the last usage alone."""
        used = self._usage_ratio(r, ws, payload, self.rt.config.context.hard_ratio, r.state.window)
        return hard_trigger.hard_due(used, ws.journal.window_of(ws.key), input_items(payload) or [])

    async def _checkpoint_turn(self, r: WindowRequest, ws: WS, payload: dict[str, Any],
                               chained: bool = False) -> tuple[str, list[dict[str, Any]]]:
        """The checkpoint turn (proxy/windows/checkpoint.py) for this request, in its current window (`chained`:
        the upstream's chain, by the request's own `previous_response_id`)."""
        rt = self.rt
        client = self.tools()
        if client is None:
            return "no_tool_server", []

        def forwarded() -> dict[str, Any]:  # the request as it would go up now, in its current window
            body = payload if chained else decorate(payload, self._forward_of(r, ws, payload, None), ws,
                                                    rt.config.bridge.families, rt.config.context.id_projection, None)
            # the tools and cache key the session's last request went up with (the bridge's and web search's tools
            # are added after this stage): the turn then extends the window's cached prefix (issue 47)
            last = rt.services.last_tools.get(r.session_key) if r.session_key is not None else None
            return {**body, **last} if last is not None else body

        outcome, executed, self._spec = await checkpoint.run_for_request(r.deps(ws.journal, client), rt.config,
                                                                         r.request, ws, forwarded, self._spec)
        return outcome, executed

    def _journal_turn(self, r: WindowRequest, ws: WS, payload: dict[str, Any], executed: list[dict[str, Any]],
                      outcome: str, kind: str) -> None:
        mark = checkpoint.journal_turn(r.state.journal, ws, input_items(payload), executed)
        if mark is not None:  # the request's mark taken again with the turn's write (its answer follows it)
            r.state.checkpoint_mark = mark  # (history's own journal_mark is history's to write)
        journal_link.record_event(ws, "checkpoint_turn", {"outcome": outcome, "reason": kind})
        debuglog.event("context", outcome="checkpoint_turn", result=outcome, reason=kind)

    # ------------------------------------------------------------------ a bridged new_context mid-turn
    def _offer_midturn(self, r: WindowRequest, ws: WS, payload: dict[str, Any], stateful: bool = False) -> None:
        """Where the bridge runs `new_context` itself, its later rounds of this agent request roll over too: the
        bridge calls `st.context_rollover` after a round whose bridged new_context succeeded. `stateful`: the
        request chains by `previous_response_id` (its rounds too, until the rollover)."""
        if "context" not in self.rt.config.bridge.families:
            return
        items = input_items(payload)
        if items or stateful:  # the agent's items as sent: later stages make new lists, never edit this one
            r.state.context_rollover = functools.partial(self._midturn, ws, items or [], stateful)

    async def _midturn(self, ws: WS, agent_items: list[Any], stateful: bool, shown: Sequence[Mapping[str, Any]],
                       payload: dict[str, Any]) -> dict[str, Any] | None:
        """The pending `new_context` consumed now: the notes window opens after the agent's items and what the
        turn showed so far, and the bridge's next round (`payload`) goes up in it, stateless from there (a
        stateful round would continue the old window upstream). None: nothing pending (or not readable: the next
        agent request rolls over instead)."""
        pending = await self._take(ws, choice.ROLLOVER_KINDS)
        if pending is None:
            return None
        return await notes_window.open_midturn(self.rt.state_store(), ws, agent_items, stateful, shown, payload,
                                               self.rt.config.bridge.families, pending.kind)

    # ------------------------------------------------------------------ the projection
    def project(self, r: WindowRequest, ws: WS | None, opened: Window | None) -> None:
        payload = r.payload
        out = self._forward_of(r, ws, payload, opened)
        if ws is not None:
            cfg = self.rt.config
            reminder = None if opened is not None else self._usage_ratio(r, ws, payload, cfg.context.reminder_ratio)
            out = decorate(payload, out, ws, cfg.bridge.families, cfg.context.id_projection, reminder, r.facts(out))
            self._first_estimate(r, ws, out)
        if out is not payload:
            r.body.replace(out)

    def _forward_of(self, r: WindowRequest, ws: WS | None, payload: dict[str, Any],
                    opened: Window | None) -> dict[str, Any]:
        """The window applied: compaction's decision, or the session's current window (`opened` now)."""
        info = r.state.window
        if opened is None and info is not None and info.checkpoint is not None:
            return project_decision(r.built(payload), info)  # compaction decided: apply that
        return projection.current(self.rt, payload, ws, info is not None, opened, r.window_session, r.built,
                                  self._report)

    def _first_estimate(self, r: WindowRequest, ws: WS, out: dict[str, Any]) -> None:
        """A session's first request: its budget is an estimate of this request (proxy/windows/budget.py)."""
        rt = self.rt
        key = r.session_key
        if key is None or rt.services.usage.get(key, budget.usage_memo(r.state)) is not None:
            return
        source = r.body.source_bytes if out is r.body.view else None
        budget.first_estimate(rt.services, rt.state.db_path, key, ws.task_id, ws.address, r.state.window, out, source)

    def _usage_ratio(self, r: WindowRequest, ws: WS, payload: dict[str, Any], ratio: float,
                     decided: WindowDecision | None = None) -> tuple[int, int] | None:
        rt = self.rt
        key = r.session_key
        u = rt.services.usage.get(key, budget.usage_memo(r.state)) if key is not None else None
        if u is None:
            return None
        model = payload.get("model") if isinstance(payload.get("model"), str) else u.model
        # the reminder reads the last usage against the same window the decision used (one window, defect 4)
        learned = budget.learned_in_process(rt.services, model)
        if decided is None and (made := r.state.window) is not None and made.window:
            learned = made.window if learned is None else min(learned, made.window)
        return hard_trigger.usage_ratio(u, model, rt.config.model_windows, ratio,
                                        lambda: ws.journal.window_of(ws.key), decided, learned)

    def _report(self, ws: WS, w: Window) -> None:
        """The agent's items no longer start with what the window covers: said once per window."""
        key = f"{ws.key}\x00{w.window_id}"
        if key in self._reported:
            return
        self._reported[key] = None
        while len(self._reported) > REPORTED_WINDOWS:
            self._reported.popitem(last=False)
        journal_link.record_event(ws, "projection", {"outcome": "diverged", "window_id": w.window_id,
                                                     "strategy": w.strategy})
