"""What the context stage adds to a forwarded request (pure, docs/context.md): exactly one guidance message where a
context tool is reachable, the identity message naming the current window, the `[id: …]` markers and the hidden
reminder. Moved out of addons/context.py (issue 29: thin addons)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from proxy.items.ids import project_ids
from proxy.items.inputs import InputFacts, client_compacts
from proxy.items.lazyitems import LazyItems, as_list, is_item_list
from proxy.windows.notes import bootstrap as boot
from proxy.windows.notes import reminder
from proxy.windows.opening import reachable_context_tools
from proxy.windows.remote.journal_link import WindowSession


def stateful_or_client(payload: dict[str, Any], facts: InputFacts | None = None) -> bool:
    """The upstream holds the history (previous_response_id, conversation), or the client compacts itself."""
    return (bool(payload.get("previous_response_id") or payload.get("conversation"))
            or client_compacts(payload, facts))


def forwarded_ids(agent_items: list[Any], forwarded: list[Any], mark: Any) -> list[str | None] | None:
    """The journal id of each forwarded item: an agent item keeps its `mark.input_ids[k]` (found by
    identity: projections keep the agent's own objects), anything the proxy made has none."""
    if mark is None or getattr(mark, "failed", True):
        return None
    try:
        ids = mark.input_ids
    except Exception:  # the journal is a record: no ids rather than a failed request
        return None
    if len(ids) != len(agent_items):
        return None
    pos = {id(item): k for k, item in enumerate(agent_items)}
    return [ids[k] if (k := pos.get(id(item))) is not None and ids[k] else None for item in forwarded]


def decorate(payload: dict[str, Any], out: dict[str, Any], ws: WindowSession, families: Iterable[str],
             id_projection: bool, remind: tuple[int, int] | None = None,
             facts: InputFacts | None = None) -> dict[str, Any]:
    """The forwarded copy with exactly one guidance message (only when its tools are reachable), the
    `[id: …]` markers and, when `remind` = (used, window), the hidden reminder last. `payload` is the
    agent's request, `out` what the projection made of it; `facts`: those of `out`'s input, when known
    (only its system/developer items are then looked at for a resent guidance or reminder)."""
    if out is not payload and stateful_or_client(out, facts):  # (the agent's own request was checked already)
        return out
    raw = out.get("input")
    if not is_item_list(raw):
        return out  # a string input: one new message, nothing to recover yet
    agent_items = payload.get("input")
    tools = reachable_context_tools(out, families)
    text = reminder.reminder_text(*remind, tools) if remind is not None and reminder.can_remind(tools) else None
    if isinstance(raw, LazyItems) and (tools or text is not None):
        # guidance, markers or a reminder go in: the items themselves (else a big input is read lazily, and only
        # its system/developer items are looked at)
        raw, agent_items = raw.materialize(), as_list(agent_items)
    instructions = facts.instructions if facts is not None else None
    if not tools and text is None and instructions is not None and not any(
            boot.is_guidance(raw[k]) or reminder.is_reminder(raw[k]) for k in instructions):
        return out  # nothing to add, and no guidance or reminder resent to drop (only instructions can be either)
    # a reminder only ever comes back as one of the input's developer messages: none there, none to drop
    resent = None if instructions is None or any(reminder.is_reminder(raw[k]) for k in instructions) else ()
    forwarded: Sequence[Any] = boot.insert_guidance(raw, tools, instructions)
    w = ws.journal.window_of(ws.key) if tools else None
    if w is not None:  # who and where: from the first window on
        forwarded = boot.insert_identity(forwarded, boot.identity_text(ws.address, w.window_id, None, ws.task_id))
    # the markers are what history_read_item takes: shown only to a session that can call it
    if id_projection and "history_read_item" in tools and isinstance(agent_items, list):
        ids = forwarded_ids(agent_items, forwarded, ws.mark)
        if ids is not None:
            forwarded = list(project_ids(forwarded, ids))
    said = reminder.SAID.get(ws.journal, ws.key, w.window_id) if w is not None else None
    if said is not None:  # said once in this window: kept where it was, never said again (the prefix, issue 47)
        forwarded = reminder.with_said(forwarded, said, resent)
    else:
        forwarded = reminder.with_reminder(forwarded, text, resent)
        if text is not None and w is not None:
            reminder.SAID.put(ws.journal, ws.key, w.window_id, len(forwarded) - 1, text)
    if forwarded is raw or (len(forwarded) == len(raw) and all(a is b for a, b in zip(forwarded, raw, strict=True))):
        return out
    return {**out, "input": forwarded}
