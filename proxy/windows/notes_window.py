"""The notes windows the window service opens (seed 000, issue 13; moved out of addons/context.py, issue 29):
at a request's rollover boundary (`roll_over`), for a stateful client (`stateful_rollover`: the new window's
bootstrap replaces `previous_response_id`), and mid-turn in a bridged turn (`open_midturn`). The bootstrap is
built once, by the one builder, when the journal assigns the window's id, and stored."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from proxy import debuglog
from proxy.items.canonical import chain_at, session_root
from proxy.items.inputs import input_items
from proxy.items.lazyitems import as_list
from proxy.journal import Window
from proxy.journal.model import FILED_AFTER_KEY
from proxy.metrics import proxy_metrics
from proxy.windows import journal_reads, opening
from proxy.windows.apply import conversation_hash, instruction_run
from proxy.windows.notes import bootstrap as boot
from proxy.windows.notes import midturn, stateful
from proxy.windows.ports import WindowStore
from proxy.windows.remote import journal_link
from proxy.windows.remote.store import CONVERSATION_KEY, LEAD_KEY

log = logging.getLogger("ctproxy.context")


def mark_ids(mark: Any, items: Sequence[Any], n: int) -> tuple[str | None, list[str] | None]:
    """The journal ids of the boundary item (`items[n-1]`) and of the items after it, from the request's
    journal mark (its ids start with the agent's items); (None, None) without a usable mark."""
    if mark is None or mark.failed or len(mark.input_ids) < len(items):
        return None, None
    return (mark.input_ids[n - 1] or None) if n else None, [i for i in mark.input_ids[n:len(items)] if i]


def open_notes_window(store: WindowStore, ws: journal_link.WindowSession, items: list[Any], n: int, kind: str,
                      tools: tuple[str, ...], boundary_item: str | None, anchor: Mapping[str, Any] | None = None,
                      follows: Sequence[str] | None = (), stateful: bool = False, at: tuple[int, str] | None = None,
                      leading: list[Any] | None = None) -> Window:
    """The notes window after `items[:n]` (the agent's items), its bootstrap built once and stored.
    `at`: its boundary (position, one-chain id) where `items` are not the whole of the agent's items (a
    stateful request's turn); `leading`: the agent's instructions then (read from the journal)."""
    j = ws.journal
    j.session(ws.key, ws.task_id, ws.address, ws.source)
    notes = opening.notes_snapshot(store, ws.task_id, ws.address, tools)
    # a copy, not the agent's objects: the stored bootstrap is what every later request replays
    leading = orjson.loads(orjson.dumps(boot.leading_instructions(items if leading is None else leading)))

    def bootstrap(prev: Window | None, window_id: str) -> dict[str, Any]:  # the id the journal assigns
        start = boot.WindowStart(ws.address, window_id, prev.window_id if prev is not None else None, notes,
                                 tools=tools, task_id=ws.task_id, reason=kind)
        stored: dict[str, Any] = {"items": boot.build_bootstrap(start, leading), **kept}
        if anchor:  # a mid-turn window: how a resend in another form still finds its boundary (midturn.py)
            stored.update(anchor)
        return stored

    # a stateful session's window is the journal's record only: the upstream chain holds its bootstrap
    root = session_root(ws.key)
    pos, at_hash = at if at is not None else (n, chain_at(items, root, n))
    lead = len(leading)
    if at is None and not stateful and 0 < lead < n and instruction_run(items, n) == lead:
        # the boundary is anchored on the conversation too: a changed instruction keeps the window (defect 3)
        kept = {LEAD_KEY: lead, CONVERSATION_KEY: conversation_hash(items, root, lead, n)}
    else:
        kept = {}
    w = j.start_window(ws.key, boundary_item, "notes", bootstrap, boundary_pos=None if stateful else pos,
                       boundary_hash=None if stateful else at_hash, reason=kind, follows=follows)
    debuglog.event("context", outcome="rollover", kind=kind, window=w.window_id, boundary=n)
    proxy_metrics().rollover("notes")
    return w


def roll_over(store: WindowStore, ws: journal_link.WindowSession, mark: Any, payload: dict[str, Any] | None,
              families: Iterable[str], kind: str) -> Window | None:
    """Open the session's notes window at the rollover boundary: calls and their outputs before it, the
    agent's trailing user messages after it. `mark`: the request's journal mark (the checkpoint turn re-took
    it with its write), else the session's."""
    items = input_items(payload) if payload is not None else None
    if not items:
        return None
    n = boot.rollover_boundary(items)
    if n == 0:
        return None  # nothing precedes the agent's messages: the window would be the one it has
    boundary_item, follows = mark_ids(mark or ws.mark, items, n)
    return open_notes_window(store, ws, items, n, kind, opening.reachable_context_tools(payload, families),
                             boundary_item, follows=follows)


async def stateful_rollover(store: WindowStore, ws: journal_link.WindowSession, mark: Any, payload: dict[str, Any],
                            families: Iterable[str], kind: str) -> dict[str, Any] | None:
    """A pending rollover for a client that chains by `previous_response_id`: the request to send, without the
    id, as the new window's bootstrap plus the agent's new messages (its outputs for the previous answer's calls
    close the old window); None when the journal refused the window (the request goes on in its chain)."""
    raw = payload.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else as_list(input_items(payload) or [])
    # Everything the agent sends after its instructions follows the bootstrap; its outputs keep their calls.
    n = boot.leading_count(items)
    missing = stateful.missing_calls(items[n:])
    moved = stateful.stateful_input(items[n:], await journal_reads.journal_calls(ws, missing) if missing else {})
    boundary_item, follows = mark_ids(mark or ws.mark, items, n)
    tools = opening.reachable_context_tools(payload, families)
    try:
        w = open_notes_window(store, ws, items, n, f"{kind}_stateful", tools, boundary_item, follows=follows,
                              stateful=True)
    except Exception:  # the journal refused: the rollover is not lost
        log.warning("context: a stateful rollover could not be opened")
        return None
    out = {k: v for k, v in payload.items() if k != "previous_response_id"}
    out["input"] = [*w.bootstrap["items"], *moved.items]
    journal_link.record_event(ws, "rollover", {"outcome": "stateful", "window_id": w.window_id, "boundary": n,
                                               "carried_calls": moved.carried, "dropped_outputs": moved.dropped})
    return out


async def open_midturn(store: WindowStore, ws: journal_link.WindowSession, agent_items: list[Any], is_stateful: bool,
                       shown: Sequence[Mapping[str, Any]], payload: dict[str, Any], families: Iterable[str],
                       kind: str) -> dict[str, Any]:
    """A pending `new_context` consumed in a bridged turn: the notes window opens after the agent's items and
    what the turn showed so far, and the bridge's next round (`payload`) goes up in it, stateless from there
    (a stateful round would continue the old window upstream)."""
    agent_items = as_list(agent_items)
    shown_items = [dict(i) for i in shown]
    full = [*agent_items, *shown_items]
    tools = opening.reachable_context_tools(payload, families)
    anchors = midturn.anchors_of(shown)
    root = session_root(ws.key)
    prefix = [len(agent_items), chain_at(agent_items, root, len(agent_items))]
    at: tuple[int, str] | None = None
    leading: list[Any] | None = None
    tail: str | None = None
    if is_stateful:  # the agent's items are the journal's branch: the boundary and instructions are read there
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
    w = open_notes_window(store, ws, full, len(full), f"{kind}_midturn", tools,
                          prefix[1] if at is not None else None, anchor if not is_stateful or at else None,
                          stateful=is_stateful and at is None, at=at, leading=leading)
    journal_link.record_event(ws, "rollover", {"outcome": "midturn", "window_id": w.window_id,
                                               "boundary": len(full)})
    try:  # the turn's later calls run on the tool server (another process): it must see the new window
        await asyncio.to_thread(ws.journal.flush, 10.0)
    except Exception:
        log.warning("context: the new window was not committed before the bridge's next round")
    return midturn.in_new_window(payload, w.bootstrap["items"])
