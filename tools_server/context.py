"""Context tools (seed 000, issue 13): `get_context_remaining` and `new_context`.

`get_context_remaining` reads what the proxy recorded for the calling agent of its task (usage of its
last answer, its current window) and says, separately, the tokens left in the model's window and the
tokens left before the hard trigger (`context.hard_ratio`), in Codex's words first. Never a made-up
number: `unknown` until an answer with usage was seen. No task, an unknown task or an unregistered
agent is an error, never another task's numbers.

`new_context` (Codex's schema: no parameters) leaves a pending rollover for the agent
(`proxy/windows/notes/rollover.py`); the projection stage consumes it at the agent's next forwarded sampling
request, whatever else that batch did. Idempotent.

`add_context_routes` adds the REST call for a manual checkpoint (`POST /v1/context/checkpoint`), the
operator's counterpart of `ctproxy context checkpoint`; it is not a model tool.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict

from proxy import usage as usage_store
from proxy.journal.query import HistoryReader
from proxy.store.interface import Store
from proxy.windows import budget
from proxy.windows.notes import rollover
from proxy.windows.notes.checkpoint import CheckpointTargetError, mark_checkpoint
from proxy.windows.remote import store as compaction_store
from tools_server.history.shared import Readers, caller_of
from tools_server.registry import CallContext, Services, Tool, ToolResult

NEW_CONTEXT_OUTPUT = "A new context window will start without summarizing conversation history."
NEW_CONTEXT_DESCRIPTION = ("Start a new context window. Does not clear, reset, or otherwise affect environment "
                           "state.")
REMAINING_DESCRIPTION = "Get the remaining tokens in the current context window."
_NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


class NoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")


GetContextRemainingArgs = NoArgs  # the name other modules import


@dataclass(frozen=True)
class Budget:
    """What get_context_remaining reports, typed."""

    agent: str
    agents: list[str]
    window_id: str | None
    model: str | None
    context_window: int | None
    used_tokens: int | None
    window_tokens_left: int | None  # the model's whole window minus what the last answer used
    hard_trigger_tokens: int | None  # where the proxy runs the checkpoint turn (context.hard_ratio)
    tokens_left: int | None  # before the hard trigger: Codex's "tokens left in this context window"
    pending: rollover.Pending | None
    estimated: bool = False  # no answer with usage yet: the figures estimate the agent's request (issue 29 (5))


def budget_of(reader: HistoryReader, task_id: str, address: str, windows: dict[str, int],
              hard_ratio: float, store: Store | None = None) -> Budget:
    """The agent's budget; its usage and pending rollover read through `store` (the state store), else on the
    reader's own connection."""
    conn = reader.conn
    if store is None:
        u = usage_store.last_usage_for_agent(conn, task_id, address)  # this task's agent only
        estimated = u is None
        if u is None:  # before its first answer with usage: an estimate of its request, said to be one
            u = usage_store.estimate_for_agent(conn, task_id, address)
    else:
        u = store.usage.for_agent(task_id, address)
        estimated = u is None
        if u is None:
            u = store.usage.estimate_for_agent(task_id, address)
    window = budget.effective_window(u.model, windows, _learned(reader, store, u.model)) if u else None
    used = (u.input_tokens + u.output_tokens) if u else None
    window_left = hard = left = None
    if window is not None and used is not None:
        window_left = max(window - used, 0)
        hard = int(window * hard_ratio)
        left = max(min(hard, window) - used, 0)
    if store is None:
        rollover.ensure(conn)
        pending = rollover.peek_pending(conn, task_id, address)
    else:
        pending = store.rollovers.peek(task_id, address)
    agents = reader.agents(task_id)
    if address not in agents:  # the caller is registered (it was resolved): text and details say the same
        agents = sorted([*agents, address])
    return Budget(address, agents, reader.current_window(task_id, address), u.model if u else None,
                  window, used, window_left, hard, left, pending,
                  estimated=estimated and u is not None)


def _learned(reader: HistoryReader, store: Store | None, model: str | None) -> int | None:
    """The window an upstream's overflow taught the proxy for `model` (any endpoint), read where the proxy
    writes it; None when none was learned or it cannot be read (the table's window then stands)."""
    if not model:
        return None
    try:
        if store is not None:
            return store.compaction().learned_window(model)
        return compaction_store.learned_window(reader.conn, model)
    except Exception:  # (sqlite3.OperationalError: no compaction table yet; a shared store that is down)
        return None


def remaining_text(b: Budget, hard_ratio: float) -> str:
    first = (f"You have {b.tokens_left} tokens left in this context window." if b.tokens_left is not None
             else "You have unknown tokens left in this context window.")
    if b.estimated and b.tokens_left is not None:
        first = (f"You have about {b.tokens_left} tokens left in this context window (an estimate: no answer with "
                 "usage has come back yet, so ctproxy estimated your request from its size).")
    lines = [first]
    if b.tokens_left is not None:
        lines.append(f"Before the hard trigger ({hard_ratio:.0%} of the window, {b.hard_trigger_tokens} tokens, where "
                     f"ctproxy saves a checkpoint and starts a new window): {b.tokens_left} tokens left. "
                     f"Whole window: {b.window_tokens_left} of {b.context_window} tokens left "
                     f"(model {b.model}, {b.used_tokens} "
                     f"{'estimated for your request' if b.estimated else 'used by the last answer'}).")
    elif b.used_tokens is not None:
        lines.append(f"The last answer used {b.used_tokens} tokens (model {b.model}); that model's context window "
                     "is not known to ctproxy (config model_windows).")
    else:
        lines.append("No answer with usage has been seen for this agent yet.")
    lines.append(f"Current agent: {b.agent}; window: {b.window_id or 'none yet'}.")
    lines.append("Agents registered in this task: " + ", ".join(b.agents) + ".")
    if b.pending is not None:
        lines.append("A new context window is pending: it starts at your next request.")
    return "\n".join(lines)


def remaining_details(b: Budget) -> dict[str, Any]:
    return {"tokens_left": b.tokens_left, "window_tokens_left": b.window_tokens_left,
            "hard_trigger_tokens": b.hard_trigger_tokens, "context_window": b.context_window,
            "used_tokens": b.used_tokens, "model": b.model, "agent": b.agent, "agents": b.agents,
            "window_id": b.window_id, "pending_rollover": b.pending.kind if b.pending else None,
            "state": "unknown" if b.tokens_left is None else "estimated" if b.estimated else "known",
            "estimated": b.estimated}


class ContextFamily:
    name = "context"

    def __init__(self, services: Services):
        self.services = services
        self.readers = Readers(services)

    async def _get_context_remaining(self, args: NoArgs, ctx: CallContext) -> ToolResult:
        cfg = self.services.config

        def run(r: HistoryReader) -> ToolResult:
            task, caller = caller_of(ctx, r)
            b = budget_of(r, task, caller, cfg.model_windows, cfg.context.hard_ratio,
                          self.services.state_store())
            return ToolResult(remaining_text(b, cfg.context.hard_ratio), remaining_details(b))

        return await self.readers.run(run)

    async def _new_context(self, args: NoArgs, ctx: CallContext) -> ToolResult:
        def run(r: HistoryReader) -> ToolResult:
            task, caller = caller_of(ctx, r)
            window = r.current_window(task, caller)
            pending = self.services.state_store().rollovers.mark(task, caller, "new_context", "tool", window)
            return ToolResult(NEW_CONTEXT_OUTPUT, {"pending_rollover": pending.kind, "agent": caller,
                                                   "window_id": window})

        return await self.readers.run(run)

    def tools(self) -> Iterable[Tool]:
        return [
            Tool(name="get_context_remaining", description=REMAINING_DESCRIPTION, family=self.name,
                 capability="context", args_model=NoArgs, execute=self._get_context_remaining,
                 parameters=dict(_NO_PARAMETERS), strict=True, parallel=True, read_only=True),
            Tool(name="new_context", description=NEW_CONTEXT_DESCRIPTION, family=self.name,
                 capability="context", args_model=NoArgs, execute=self._new_context,
                 parameters=dict(_NO_PARAMETERS), strict=True, parallel=False, read_only=False),
        ]

    async def close(self) -> None:
        self.readers.close()


def create_family(services: Services) -> ContextFamily:
    return ContextFamily(services)


def add_context_routes(app: web.Application, services_of: Callable[[web.Application], Services]) -> None:
    """`POST /v1/context/checkpoint` with `{"session": KEY}` or `{"task": T, "agent": A}`: 200 with the
    pending rollover; 400/404 with a clear error (behind the tool server's bearer-token middleware)."""

    async def checkpoint(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not all(isinstance(body.get(k), (str, type(None)))
                                                 for k in ("session", "task", "agent")):
            return _error(400, "invalid_arguments", 'send {"session": KEY} or {"task": T, "agent": A}')
        extra = set(body) - {"session", "task", "agent"}
        if extra:
            return _error(400, "invalid_arguments", f"unknown field {sorted(extra)[0]!r}")
        services = services_of(request.app)

        def run() -> rollover.Pending:  # through the process's store: its journal, its rollovers
            return mark_checkpoint(services.state_store(), body.get("session"), body.get("task"), body.get("agent"),
                                   "rest", services.config)

        try:
            pending = await asyncio.to_thread(run)
        except CheckpointTargetError as exc:
            status = 404 if exc.code.startswith("unknown_") else 409 if exc.code.endswith("_off") else 400
            return _error(status, exc.code, exc.message)
        return web.json_response({"ok": True, "task": pending.task_id, "agent": pending.address,
                                  "pending_rollover": pending.kind, "window_id": pending.window_id})

    app.router.add_post("/v1/context/checkpoint", checkpoint)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)
