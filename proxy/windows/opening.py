"""What every new window starts with, whatever path opened it (issue 29 (4)): the one bootstrap builder
(`proxy.context.bootstrap.window_notes` / `build_bootstrap`) fed the same way for new_context, the hard
trigger, a manual checkpoint, overflow recovery and a failed checkpoint turn.

`window_notes_for` returns the builder the journal calls when it opens the window (`Journal.start_window`
assigns the window id, and only there): the identity names that id and the window before it, the notes
index is the agent's own notes at that moment, the guidance lists the context tools the session can call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from proxy.context import bootstrap as boot
from proxy.journal import Window
from proxy.store.interface import Store
from proxy.store.postgres import StoreError

FAMILY_TOOLS = {"history": boot.HISTORY_TOOLS, "notes": boot.NOTES_TOOLS, "context": boot.CONTEXT_TOOLS}
_CONTEXT_TOOL_NAMES = frozenset(boot.ALL_TOOLS)
_last_reachable: list[Any] = [None, None, ()]  # the tools list last asked of, the families then, the answer


def declared_tool_name(tool: Any) -> str | None:
    """A function tool's name as ctproxy knows it (Codex's `mcp__<server>__<tool>` mapped back)."""
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        return None
    name = tool["name"]
    return name.rsplit("__", 1)[-1] if name.startswith("mcp__") else name


def reachable_context_tools(payload: dict[str, Any], families: Iterable[str]) -> tuple[str, ...]:
    """The context tools the session can call: bridged (`bridge.families`) or declared by the agent. Asked
    several times of one request's `tools`: the last answer is kept."""
    tools = payload.get("tools")
    families = list(families)
    last = _last_reachable
    if last[0] is tools and tools is not None and last[1] == families:
        return last[2]
    names: set[str] = set()
    for fam in families:
        names.update(FAMILY_TOOLS.get(fam, ()))
    if isinstance(tools, list):
        names.update(n for t in tools if (n := declared_tool_name(t)) is not None)
    found = boot.reachable_tools(names) if not names.isdisjoint(_CONTEXT_TOOL_NAMES) else ()
    if tools is not None:  # (the list is the request's own, never changed in place: ADR 0006)
        last[:] = [tools, families, found]
    return found


def notes_snapshot(store: Store, task_id: str, address: str,
                   tools: tuple[str, ...] = boot.ALL_TOOLS) -> boot.NotesSnapshot:
    """The agent's own notes at a reset, from the state store; an unusable task id or directory gives "index
    unavailable". An agent that cannot read its notes (`tools`) gets the newest note's text in its bootstrap."""
    try:
        return boot.read_notes_index(store.notes(task_id), address, with_text="notes_read_file" not in tools)
    except (OSError, ValueError, StoreError):  # (StoreError: a shared store that cannot be reached)
        return boot.NotesSnapshot(address, None)


def window_notes_for(store: Store, task_id: str, address: str, tools: tuple[str, ...],
                     reason: str) -> Callable[[Window | None, str], dict[str, Any]]:
    """For a remote/fallback window: the builder of its notes parts (`preface`, `coda` in its bootstrap)."""
    notes = notes_snapshot(store, task_id, address, tools)

    def build(prev: Window | None, window_id: str) -> dict[str, Any]:
        start = boot.WindowStart(address, window_id, prev.window_id if prev is not None else None, notes,
                                 tools=tools, task_id=task_id, reason=reason)
        head, tail = boot.window_notes(start)
        return {"preface": head, "coda": tail}

    return build
