"""The checkpoint turn, run by the window service (seed 000, issue 13; moved out of addons/context.py, issue 29).

One turn upstream (the current window + the instruction, only the own-notes write offered and required), exactly
one own-notes write executed on the tool server (a failed one, or one outside the agent's own notes, corrected
once). The pure parts (the turn's body, reading the write call, the correction) are
`proxy/windows/notes/checkpoint_turn`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.items.bounded import decode_bounded
from proxy.toolclient import ToolCall, ToolClient, ToolServerUnreachable
from proxy.upstream import UpstreamBroken, UpstreamUnavailable
from proxy.windows.notes import checkpoint_turn as ckturn
from proxy.windows.remote.journal_link import WindowSession
from proxy.windows.service import WindowDeps

log = logging.getLogger("ctproxy.context")

# the checkpoint turn's own body (JSON, not streamed, not compressed) replaces these of the agent's request
REPLACED_HEADERS = frozenset({"content-length", "content-encoding", "content-type", "accept-encoding", "accept"})


@dataclass(frozen=True)
class TurnTarget:
    """Where the turn goes: the agent's request's own destination, with its own headers (credentials among
    them, sent only under the one credential rule: `WindowDeps.credentials_allowed`)."""

    url: str
    headers: Sequence[tuple[str, str]] = field(repr=False)
    instruction: str
    timeout: float
    max_body_bytes: int


async def send_turn(deps: WindowDeps, target: TurnTarget, body: dict[str, Any]) -> dict[str, Any] | None:
    """The turn through the upstream-turn service; the held JSON answer, or None."""
    headers = [(k, v) for k, v in target.headers if k.lower() not in REPLACED_HEADERS]
    headers += [("content-type", "application/json"), ("accept", "application/json"),
                ("accept-encoding", "identity")]
    up = deps.turns.prepare("POST", target.url, headers, orjson.dumps(body), deps.credentials_allowed)
    try:
        async with asyncio.timeout(target.timeout):  # the whole answer, not only its headers
            held = await deps.turns.hold(up, timeout=target.timeout)
    except (UpstreamUnavailable, UpstreamBroken, TimeoutError):
        return None
    if held.status != 200:
        return None
    try:
        raw = decode_bounded(held.body, held.header("content-encoding"), target.max_body_bytes)
        answer = orjson.loads(raw)
    except Exception:  # an answer we cannot read is a failed turn, never a failed request
        return None
    return answer if isinstance(answer, dict) else None


async def run_turn(deps: WindowDeps, target: TurnTarget, ws: WindowSession, forwarded: dict[str, Any],
                   spec: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """Returns `written` or why not (a category), and the executed writes as the journal keeps them.
    `forwarded`: the agent's request as it would go up now; `spec`: the own-notes write tool's."""
    executed: list[dict[str, Any]] = []
    client = deps.tools
    if client is None:
        return "no_tool_server", executed
    extra: list[Any] = []
    why = "write_failed"
    for _attempt in range(2):
        body = ckturn.turn_body(forwarded, spec, target.instruction, extra)
        answer = await send_turn(deps, target, body)
        if answer is None:
            return "upstream_failed", executed
        call, why = ckturn.write_call(answer)
        if call is None:
            return why, executed
        if not ckturn.own_path(call.arguments, ws.address):
            # another agent's notes never lift the fence: refused unexecuted, and corrected once
            extra = ckturn.correction(call, ckturn.not_own_text(ws.address))
            why = "not_own_notes"
            continue
        try:
            out = await client.call(ToolCall(ckturn.WRITE_TOOL, "function", call.arguments, call_id=call.call_id,
                                             task=ws.task_id, agent=ws.address, session=ws.key))
        except ToolServerUnreachable:
            return "no_tool_server", executed
        executed.append(ckturn.journal_record(call, out.output, out.is_error))
        if not out.is_error:
            return "written", executed
        extra = ckturn.correction(call, out.output)
        why = "write_failed"
    return why, executed


def journal_turn(journal: Any, ws: WindowSession, items: list[Any] | None,
                 executed: list[dict[str, Any]]) -> Any:
    """The writes the checkpoint turn executed, journaled in the window they close, after the agent's items:
    returns the request's journal mark taken again with them (so its answer follows them on the branch), or
    None. The agent never resends them; the journal skips them then (`mcp_call` is a hosted tool's trace,
    proxy/items/canonical.SKIPPABLE_TYPES)."""
    if not executed or ws.mark is None or journal is not ws.journal or not items:
        return None  # history is off (or nothing ran): no items are journaled
    try:
        return journal.begin_request(ws.key, ws.task_id, ws.address, ws.source, {"input": [*items, *executed]})
    except Exception:  # the journal is a record: never a reason to fail the request
        log.warning("context: the checkpoint turn's write was not journaled")
        return None


async def write_spec(client: ToolClient) -> dict[str, Any] | None:
    """The own-notes write tool's spec, as the tool server offers it (None: not available there)."""
    for tool in await client.specs():
        if tool.name == ckturn.WRITE_TOOL and tool.available:
            return dict(tool.function)
    return None


async def run_for_request(deps: WindowDeps, config: Any, request: Any, ws: WindowSession,
                          forwarded: Callable[[], dict[str, Any]], spec: dict[str, Any] | None,
                          ) -> tuple[str, list[dict[str, Any]], dict[str, Any] | None]:
    """The checkpoint turn for an agent's `request` (its destination and headers), in its current window
    (`forwarded()`: the request as it would go up now). `spec`: the write tool's, when already known. Returns
    the outcome, the executed writes, and the spec (to keep)."""
    if deps.tools is None:
        return "no_tool_server", [], spec
    if spec is None:
        try:
            spec = await write_spec(deps.tools)
        except ToolServerUnreachable:
            return "no_tool_server", [], None
    if spec is None:
        return "no_write_tool", [], None
    ctx = config.context
    target = TurnTarget(request.url, tuple(request.headers.items(multi=True)), ctx.checkpoint_instruction,
                        ctx.checkpoint_timeout_seconds, config.limits.max_body_bytes)
    outcome, executed = await run_turn(deps, target, ws, forwarded(), spec)
    return outcome, executed, spec
