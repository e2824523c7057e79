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

A strategy is one entry of `PROJECTIONS`: window → `WindowProjection` (or None: not applied now).
remote/fallback are compaction's (its decision applies them in the chain); any other strategy (notes,
issue 13) is applied from the session's current window whether or not compaction decided, e.g.
`PROJECTIONS["notes"] = stored_projection` for a window whose bootstrap JSON holds `{"items": [...]}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import orjson
from mitmproxy import ctx, http

from addons._flow import destination_route, header_map, is_reverse, session_of
from addons._stage import Stage
from proxy import dbworker, debuglog, routes, runtime
from proxy import usage as usage_store
from proxy.compaction import journal_link
from proxy.compaction.decision import TAIL_FRACTION
from proxy.compaction.eligibility import remote_call
from proxy.compaction.fingerprint import load_key
from proxy.compaction.store import Checkpoint
from proxy.context import bootstrap as boot
from proxy.context import checkpoint_turn as ckturn
from proxy.context import midturn, reminder, stateful
from proxy.context.decorate import decorate, stateful_or_client
from proxy.context.rollover import Kind, RolloverStore
from proxy.flowbody import ResponsesBody, commit_if_alone, responses_body
from proxy.flowstate import state_of
from proxy.journal import COMPACTION_STRATEGIES, Window
from proxy.journal.canonical import chain_at, session_root
from proxy.journal.model import FILED_AFTER_KEY
from proxy.metrics import proxy_metrics
from proxy.toolclient import ToolClient, ToolServerUnreachable
from proxy.transforms.compaction import ProjectionContext, apply_projection, fit_projection
from proxy.transforms.items import InputFacts, approx_tokens_for_bytes, input_items, items_bytes
from proxy.transforms.lazyitems import as_list, is_item_list, plain_payload
from proxy.transforms.window import WindowProjection, apply_window
from proxy.windows import budget, checkpoint, journal_reads, opening, service
from proxy.windows.decision import WindowDecision

log = logging.getLogger("ctproxy.context")

REPORTED_WINDOWS = 4096  # windows whose divergence this process has recorded (once each)
CONTEXT_REASON = "context_"  # the reason of a compaction window this stage opened (context_threshold, …)


def _checkpoint_projection(w: Window, rt: runtime.Runtime) -> WindowProjection | None:
    """remote / fallback, alone: the readable bootstrap, while compaction or overflow recovery is on."""
    cfg = rt.config.remote_compaction
    cp = Checkpoint.from_window(w)
    # the context stage's own compactions (hard trigger, failed checkpoint turn) apply while context is on
    ours = rt.config.context.enabled and (w.reason or "").startswith(CONTEXT_REASON)
    if cp is None or not (cfg.enabled or rt.config.recovers_overflow() or ours):
        return None
    return cp.record().projection(replay_opaque=False)


def stored_projection(w: Window, rt: runtime.Runtime) -> WindowProjection | None:
    """A window whose bootstrap is stored whole (`bootstrap["items"]`, built when the window was opened)."""
    items = w.bootstrap.get("items")
    if w.boundary_pos is None or not w.boundary_hash or not isinstance(items, list):
        return None
    return WindowProjection(w.window_id, w.boundary_pos, w.boundary_hash, session_root(w.session_key),
                            tuple(items))


PROJECTIONS: dict[str, Callable[[Window, runtime.Runtime], WindowProjection | None]] = {
    "remote": _checkpoint_projection,
    "fallback": _checkpoint_projection,
    "notes": stored_projection,  # issue 13: the bootstrap built once at the rollover, replayed byte for byte
}
# What this stage always consumes at a request: `new_context`. A manual checkpoint is consumed only where
# the checkpoint turn can run (the own-notes write tool reachable, the tool server known); else it waits.
ROLLOVER_KINDS: tuple[Kind, ...] = ("new_context",)


def project_decision(payload: dict[str, Any], info: WindowDecision) -> dict[str, Any]:
    """Compaction's decision applied: its checkpoint's bootstrap (opaque when it may be replayed), given
    way to the budget compaction set. The same pure transforms compaction sized the request with."""
    cp = info.checkpoint
    if cp is None:
        return payload
    out, outcome = apply_projection(payload, ProjectionContext(cp.record(), info.replay_opaque),
                                    checked=info.boundary_checked)
    if info.fit_budget is not None and outcome in ("remote", "fallback"):
        out = fit_projection(out, info.client_items[cp.boundary:], info.fit_budget) or out
    return out


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

    def _store(self) -> RolloverStore:
        if self._rollovers is None:
            rt = self.rt
            self._rollovers = RolloverStore(dbworker.shared(rt.services, rt.state.db_path), rt.state.db_path)
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
            pending = await self._store().take(ws.task_id, ws.address, ROLLOVER_KINDS)
        except Exception:
            log.warning("context: could not read the pending rollover of a session")
            pending = None
        body = responses_body(flow)
        if pending is None or body is None:
            self._project(flow, None, None)
            return
        payload = body.value
        raw = payload.get("input")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else as_list(input_items(payload) or [])
        # Everything the agent sends after its instructions follows the bootstrap; its outputs keep their calls.
        n = boot.leading_count(items)
        missing = stateful.missing_calls(items[n:])
        moved = stateful.stateful_input(items[n:], await journal_reads.journal_calls(ws, missing) if missing else {})
        mark = state_of(flow).journal_mark or ws.mark
        boundary_item, follows = None, None
        if mark is not None and not mark.failed and len(mark.input_ids) >= len(items):
            boundary_item = (mark.input_ids[n - 1] or None) if n else None
            follows = [i for i in mark.input_ids[n:len(items)] if i]
        tools = reachable_context_tools(payload, self.rt)
        try:
            w = self._open_notes_window(ws, items, n, f"{pending.kind}_stateful", tools, boundary_item,
                                        follows=follows, stateful=True)
        except Exception:  # the journal refused: the request goes on in its chain, the rollover is not lost
            log.warning("context: a stateful rollover could not be opened")
            self._project(flow, None, None)
            return
        out = {k: v for k, v in payload.items() if k != "previous_response_id"}
        out["input"] = [*w.bootstrap["items"], *moved.items]
        journal_link.record_event(ws, "rollover", {"outcome": "stateful", "window_id": w.window_id, "boundary": n,
                                                   "carried_calls": moved.carried, "dropped_outputs": moved.dropped})
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
        # A manual checkpoint is served by the checkpoint turn, which offers the own-notes write tool itself
        # (whether or not the agent declares it: issue 29 (2)), or by a compaction: it waits only for a
        # tool server to run the write.
        can_manual = strategy != "notes" or self._tools_client() is not None
        kinds = (*ROLLOVER_KINDS, "checkpoint") if can_manual else ROLLOVER_KINDS
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
        """"threshold" when nothing is pending and the hard trigger is reached (and something can serve it)."""
        return "threshold" if (can_turn or strategy != "notes") and self._hard(flow, ws, payload) else None

    async def _roll(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                    kind: str | None, strategy: str) -> None:
        if kind in ("checkpoint", "threshold") and strategy != "notes":
            # remote compaction (where eligible) or the readable fallback, instead of the checkpoint turn
            done = await self._compact(flow, ws, kind, remote=strategy == "remote")
            journal_link.record_event(ws, "hard_trigger" if kind == "threshold" else "manual_checkpoint",
                                      {"strategy": strategy, "outcome": done})
            debuglog.event("context", phase=kind, strategy=strategy, outcome=done)
            if done != "none":
                return
            # nothing to compact: a manual checkpoint still rolls over (a notes window), the trigger does not
            kind = "checkpoint_failed" if kind == "checkpoint" else None
        if kind in ("checkpoint", "threshold"):
            payload = _built(flow, payload)
            outcome, executed = await self._checkpoint_turn(flow, ws, payload)
            self._journal_turn(flow, ws, payload, executed)
            journal_link.record_event(ws, "checkpoint_turn", {"outcome": outcome, "reason": kind})
            debuglog.event("context", outcome="checkpoint_turn", result=outcome, reason=kind)
            if outcome != "written" and kind == "checkpoint":
                # Seed 000: an unsaved manual checkpoint cancels the compaction and keeps the current window
                # (the guidance says only a saved own-notes write lets the window go).
                journal_link.record_event(ws, "manual_checkpoint", {"outcome": "kept_window", "reason": outcome})
                self._project(flow, ws, None)
                return
            if outcome != "written":  # the hard trigger: compaction (remote where eligible, else readable)
                if await self._compact(flow, ws, kind, remote=True) != "none":
                    return
                kind = f"{kind}_failed"  # nothing to compact: a notes window all the same
        opened = self._roll_over(ws, flow, kind) if kind is not None else None
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

    def _seen(self, ws: journal_link.WindowSession, items: list[Any], n: int) -> list[Any] | None:
        """What the model sees of `items[:n]` in a notes window (its bootstrap, then the agent's items after
        its boundary); None when the current window is not a notes window that applies."""
        w = ws.journal.window_of(ws.key)
        proj = stored_projection(w, self.rt) if w is not None and w.strategy == "notes" else None
        if proj is None or proj.boundary > n:
            return None
        out, outcome = apply_window({"input": items[:n]}, proj)
        return out["input"] if outcome == "applied" else None

    async def _compact(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, kind: str,
                       remote: bool) -> str:
        """Compact the session's window at the rollover boundary and forward this request in the new one:
        remote compaction v2 where eligible (compaction's one rule, proxy/compaction/eligibility.py) and
        `remote`, else the readable fallback (no upstream call). At most one compaction per agent request:
        none when compaction already compacted this one. Returns the strategy made, or `none`."""
        body = responses_body(flow)
        if body is None:
            return "none"
        payload = body.value
        items = input_items(payload)
        n = boot.rollover_boundary(items) if items else 0
        if not items or n == 0:
            return "none"
        rt = self.rt
        st = state_of(flow)
        info = st.window
        if info is not None and info.compacted:
            return "none"  # compaction compacted this request already: never a second one
        previous = journal_link.current_checkpoint(ws)
        if previous is not None and previous.boundary >= n:
            return "none"
        model = payload.get("model") if isinstance(payload.get("model"), str) else ""
        window = info.window if info is not None else usage_store.model_window(model, rt.config.model_windows)
        cfg = rt.config.remote_compaction
        if rt.services.compaction_key is None:
            rt.services.compaction_key = load_key(rt.state.root)
        route = self._route(flow)
        allowed = self._credentials_allowed(flow, route)
        req = flow.request
        call = remote_call(cfg, route, req.scheme, req.host, req.port, req.path, header_map(flow), allowed, model,
                           rt.services.compaction_key)
        reason = f"{CONTEXT_REASON}{kind}"
        ident = session_of(flow, rt.services.response_aliases)
        order = service.CompactionOrder(
            windows=ws, session_key=ident.session_key if ident is not None else ws.key, items=items, boundary=n,
            previous=previous, replay_opaque=bool(info is not None and info.replay_opaque and previous is not None),
            payload=payload, window=window, fingerprint=call.fingerprint, target=call.target,
            remote_blocked=call.blocked if remote else "strategy_fallback", reason=reason,
            notes=opening.window_notes_for(rt.state_store(), ws.task_id, ws.address,
                                           reachable_context_tools(payload, rt), reason),
            seen=self._seen(ws, items, n))
        try:  # the one compaction path (proxy/windows/service.py)
            cp = await service.compact_and_open(service.deps_of(rt, route, allowed, ws.journal), order)
        except Exception:  # the journal or the engine refused: the caller falls back to a notes window
            log.warning("context: a compaction at the hard trigger could not be opened")
            return "none"
        proxy_metrics().rollover(cp.strategy)
        replay = cp.strategy == "remote"
        if info is not None:  # the decision derived: overflow recovery and the request log see this window
            st.window = dataclasses.replace(info, checkpoint=cp, replay_opaque=replay, outcome=cp.strategy,
                                            compacted=True, compacted_items=len(items), fit_budget=None)
        out, _ = apply_projection(payload, ProjectionContext(cp.record(), replay), checked=True)
        out = decorate(payload, out, ws, rt.config.bridge.families, rt.config.context.id_projection, None)
        if out is not payload:
            body.replace(out)
            commit_if_alone(flow)
        return cp.strategy

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
        if used is None:
            return False
        # Right after a new window, a second one helps only when the agent's items since its boundary weigh
        # something (compaction's rule, TAIL_FRACTION of the window): a bootstrap that alone is above the
        # hard trigger would otherwise make every request run a checkpoint turn or compact (never a loop).
        w = ws.journal.window_of(ws.key)
        items = input_items(payload) or []
        if w is None or w.boundary_pos is None or w.boundary_pos > len(items):
            return True
        return approx_tokens_for_bytes(items_bytes(items[w.boundary_pos:])) >= TAIL_FRACTION * used[1]

    async def _write_spec(self, client: ToolClient) -> dict[str, Any] | None:
        if self._spec is None:
            for tool in await client.specs():
                if tool.name == ckturn.WRITE_TOOL and tool.available:
                    self._spec = dict(tool.function)
        return self._spec

    async def _checkpoint_turn(self, flow: http.HTTPFlow, ws: journal_link.WindowSession,
                               payload: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
        """The checkpoint turn (proxy/windows/checkpoint.py) for this request, in its current window."""
        rt = self.rt
        client = self._tools_client()
        if client is None:
            return "no_tool_server", []
        try:
            spec = await self._write_spec(client)
        except ToolServerUnreachable:
            return "no_tool_server", []
        if spec is None:
            return "no_write_tool", []
        forwarded = decorate(payload, self._forward_of(flow, ws, payload, None), ws, rt.config.bridge.families,
                             rt.config.context.id_projection, None)
        route = self._route(flow)
        deps = service.deps_of(rt, route, self._credentials_allowed(flow, route), ws.journal, client)
        req = flow.request
        target = checkpoint.TurnTarget(req.url, tuple(req.headers.items(multi=True)),
                                       rt.config.context.checkpoint_instruction,
                                       rt.config.context.checkpoint_timeout_seconds, rt.config.limits.max_body_bytes)
        return await checkpoint.run_turn(deps, target, ws, forwarded, spec)

    def _journal_turn(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                      executed: list[dict[str, Any]]) -> None:
        """The writes the checkpoint turn executed, journaled in the window they close, after the agent's
        items: this request's journal mark is taken again with them, so its answer follows them on the
        branch. The agent never resends them; the journal skips them then (`mcp_call` is a hosted tool's
        trace, proxy/journal/canonical.SKIPPABLE_TYPES)."""
        st = state_of(flow)
        j = st.journal
        items = input_items(payload)
        if not executed or ws.mark is None or j is not ws.journal or not items:
            return  # history is off (or nothing ran): no items are journaled
        try:
            st.journal_mark = j.begin_request(ws.key, ws.task_id, ws.address, ws.source,
                                              {"input": [*items, *executed]})
        except Exception:  # the journal is a record: never a reason to fail the request
            log.warning("context: the checkpoint turn's write was not journaled")

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

    def _roll_over(self, ws: journal_link.WindowSession, flow: http.HTTPFlow, kind: str) -> Window | None:
        """Open the session's notes window at the rollover boundary: calls and their outputs before it,
        the agent's trailing user messages after it. The bootstrap is built once, here, and stored."""
        body = responses_body(flow)
        items = input_items(body.value) if body is not None else None
        if not items:
            return None
        n = boot.rollover_boundary(items)
        if n == 0:
            return None  # nothing precedes the agent's messages: the window would be the one it has
        mark = state_of(flow).journal_mark or ws.mark  # (the checkpoint turn re-took it with its write)
        boundary_item, follows = None, None
        if mark is not None and not mark.failed and len(mark.input_ids) >= len(items):
            # the mark's ids start with the agent's items (a checkpoint turn's write follows them)
            boundary_item = mark.input_ids[n - 1] or None
            follows = [i for i in mark.input_ids[n:len(items)] if i]
        return self._open_notes_window(ws, items, n, kind, reachable_context_tools(body.value, self.rt),
                                       boundary_item, follows=follows)

    def _open_notes_window(self, ws: journal_link.WindowSession, items: list[Any], n: int, kind: str,
                           tools: tuple[str, ...], boundary_item: str | None,
                           anchor: Mapping[str, Any] | None = None, follows: Sequence[str] | None = (),
                           stateful: bool = False, at: tuple[int, str] | None = None,
                           leading: list[Any] | None = None) -> Window:
        """The notes window after `items[:n]` (the agent's items), its bootstrap built once and stored.
        `at`: its boundary (position, one-chain id) where `items` are not the whole of the agent's items (a
        stateful request's turn); `leading`: the agent's instructions then (read from the journal)."""
        rt = self.rt
        j = ws.journal
        j.session(ws.key, ws.task_id, ws.address, ws.source)
        notes = _notes_index(rt, ws.task_id, ws.address)
        # a copy, not the agent's objects: the stored bootstrap is what every later request replays
        leading = orjson.loads(orjson.dumps(boot.leading_instructions(items if leading is None else leading)))

        def bootstrap(prev: Window | None, window_id: str) -> dict[str, Any]:  # the id the journal assigns
            start = boot.WindowStart(ws.address, window_id, prev.window_id if prev is not None else None, notes,
                                     tools=tools, task_id=ws.task_id, reason=kind)
            stored: dict[str, Any] = {"items": boot.build_bootstrap(start, leading)}
            if anchor:  # a mid-turn window: how a resend in another form still finds its boundary (midturn.py)
                stored.update(anchor)
            return stored

        # a stateful session's window is the journal's record only: the upstream chain holds its bootstrap
        pos, at_hash = at if at is not None else (n, chain_at(items, session_root(ws.key), n))
        w = j.start_window(ws.key, boundary_item, "notes", bootstrap, boundary_pos=None if stateful else pos,
                           boundary_hash=None if stateful else at_hash, reason=kind, follows=follows)
        debuglog.event("context", outcome="rollover", kind=kind, window=w.window_id, boundary=n)
        proxy_metrics().rollover("notes")
        return w

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
            pending = await self._store().take(ws.task_id, ws.address, ROLLOVER_KINDS)
        except Exception:  # the state database is a record: the next agent request rolls over instead
            log.warning("context: could not read the pending rollover of a session")
            return None
        if pending is None:
            return None
        agent_items = as_list(agent_items)
        shown_items = [dict(i) for i in shown]
        full = [*agent_items, *shown_items]
        tools = reachable_context_tools(payload, self.rt)
        anchors = midturn.anchors_of(shown)
        root = session_root(ws.key)
        prefix = [len(agent_items), chain_at(agent_items, root, len(agent_items))]
        at: tuple[int, str] | None = None
        leading: list[Any] | None = None
        tail: str | None = None
        if stateful:  # the agent's items are the journal's branch: the boundary and instructions are read there
            branch = await asyncio.to_thread(journal_reads.branch_of, ws)
            if branch is not None:
                n_agent, tail, leading = branch
                prefix = [n_agent, tail]
                at = (n_agent + len(shown_items), chain_at(shown_items, tail, len(shown_items)) or tail)
        else:
            tail = await asyncio.to_thread(journal_reads.tail_of, ws)
        anchor = {midturn.ANCHOR_KEY: anchors[0] if anchors else None,
                  midturn.ANCHORS_KEY: anchors, midturn.PREFIX_KEY: prefix}
        if tail and shown_items:  # the answer's items up to here stay in the old window when it is journaled
            anchor[FILED_AFTER_KEY] = chain_at(shown_items, tail, len(shown_items))
        w = self._open_notes_window(ws, full, len(full), f"{pending.kind}_midturn", tools,
                                    prefix[1] if at is not None else None, anchor if not stateful or at else None,
                                    stateful=stateful and at is None, at=at, leading=leading)
        journal_link.record_event(ws, "rollover", {"outcome": "midturn", "window_id": w.window_id,
                                                   "boundary": len(full)})
        try:  # the turn's later calls run on the tool server (another process): it must see the new window
            await asyncio.to_thread(ws.journal.flush, 10.0)
        except Exception:
            log.warning("context: the new window was not committed before the bridge's next round")
        return midturn.in_new_window(payload, w.bootstrap["items"])

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
        return self._current(flow, payload, ws, decided=info is not None, window=opened)

    def _first_estimate(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, body: ResponsesBody,
                        out: dict[str, Any]) -> None:
        """A session no answer with usage came back for yet: its budget is an estimate of this request
        (compaction's, when it decided it; else the forwarded size at 4 bytes a token), labelled as such."""
        rt = self.rt
        ident = session_of(flow, rt.services.response_aliases)
        if ident is None or rt.services.usage.get(ident.session_key) is not None:
            return
        decided = state_of(flow).window
        if decided is not None and decided.estimate is not None:
            tokens = decided.estimate.tokens
        else:
            size = body.source_bytes if out is body.view and body.source_bytes else items_bytes(
                input_items(out) or [])
            tokens = approx_tokens_for_bytes(size)
        model = out.get("model") if isinstance(out.get("model"), str) else None
        try:
            budget.record_estimate(rt.services, rt.state.db_path, ident.session_key, ws.task_id, ws.address, model,
                                   int(tokens))
        except Exception:  # a record: never a reason to fail the request
            log.warning("context: a first request's estimate was not recorded")

    def _reminder(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                  opened: Window | None) -> tuple[int, int] | None:
        if opened is not None:
            return None  # this request starts a new window: the last usage was the old window's
        return self._usage_ratio(flow, ws, payload, self.rt.config.context.reminder_ratio)

    def _usage_ratio(self, flow: http.HTTPFlow, ws: journal_link.WindowSession, payload: dict[str, Any],
                     ratio: float) -> tuple[int, int] | None:
        """(tokens used, window) when the session's last recorded answer, in its current window, used
        `ratio` of the model's window; else None."""
        rt = self.rt
        ident = session_of(flow, rt.services.response_aliases)
        u = rt.services.usage.get(ident.session_key) if ident is not None else None
        if u is None:
            return None
        model = payload.get("model") if isinstance(payload.get("model"), str) else u.model
        window = usage_store.model_window(model, rt.config.model_windows)
        used = u.input_tokens + u.output_tokens
        if window is None or not reminder.reminder_due(used, window, ratio):
            return None
        w = ws.journal.window_of(ws.key)
        if w is not None and w.created_at > u.updated_at:
            return None  # the usage predates the current window (a rollover since)
        return used, window

    def _current(self, flow: http.HTTPFlow, payload: dict[str, Any], ws: journal_link.WindowSession | None,
                 decided: bool, window: Window | None = None) -> dict[str, Any]:
        """The session's current window, found here, applied to `payload` (or `payload` itself).
        `decided`: compaction has decided this request (no checkpoint in effect, or a diverged one): only
        the other strategies are left to apply."""
        rt = self.rt
        others = _other_strategies()
        cfg = rt.config.remote_compaction
        if window is None and not others and (decided or not (cfg.enabled or rt.config.recovers_overflow())):
            return payload  # no strategy could apply
        if input_items(payload) is None:
            return payload
        if ws is None:  # (a window session exists only for a stateless request the client does not compact)
            ws = self._window_session(flow)
            if ws is None:
                return payload
        w = window
        if w is None:
            mark = ws.mark
            w = mark.state.window if mark is not None and mark.state is not None else ws.journal.window_of(ws.key)
        if w is None or (window is None and decided and w.strategy in COMPACTION_STRATEGIES):
            return payload
        make = PROJECTIONS.get(w.strategy)
        proj = make(w, rt) if make is not None else None
        if proj is None:
            return payload
        payload = _built(flow, payload)  # the window rewrites the history: the items themselves
        projected, outcome = apply_window(payload, proj)
        if outcome == "diverged" and (cp := Checkpoint.from_window(w)) is not None:
            moved = journal_link.journal_boundary(ws.mark, cp)  # the journal's alignment, as compaction does
            if moved is not None:
                proj = moved.record().projection(replay_opaque=False)
                projected, outcome = apply_window(payload, proj, checked=True)
        elif outcome == "diverged" and (anchored := midturn.reanchored(
                input_items(payload) or [], proj,
                w.bootstrap.get(midturn.ANCHORS_KEY) or w.bootstrap.get(midturn.ANCHOR_KEY),
                w.bootstrap.get(midturn.PREFIX_KEY))) is not None:
            projected, outcome = apply_window(payload, anchored, checked=True)  # a mid-turn window, resent
        debuglog.event("context", outcome=outcome, strategy=w.strategy, window=w.window_id)
        if outcome == "diverged":
            self._report(ws, w)
        elif outcome == "applied":
            return projected
        return payload

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


def _notes_index(rt: runtime.Runtime, task_id: str, address: str) -> boot.NotesSnapshot:
    return opening.notes_snapshot(rt.state_store(), task_id, address)


def reachable_context_tools(payload: dict[str, Any], rt: runtime.Runtime) -> tuple[str, ...]:
    """The context tools the session can call (proxy/windows/opening.py)."""
    return opening.reachable_context_tools(payload, rt.config.bridge.families)


def _other_strategies() -> bool:
    """A strategy not decided by compaction is registered (notes, issue 13)."""
    return not PROJECTIONS.keys() <= COMPACTION_STRATEGIES


addons = [Context()]
