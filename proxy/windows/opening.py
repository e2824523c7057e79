"""What every new window starts with, whatever path opened it (issue 29 (4)): the one bootstrap builder
(`proxy.windows.notes.bootstrap.window_notes` / `build_bootstrap`) fed the same way for new_context, the hard
trigger, a manual checkpoint, overflow recovery and a failed checkpoint turn.

`window_notes_for` returns the builder the journal calls when it opens the window (`Journal.start_window`
assigns the window id, and only there): the identity names that id and the window before it, the notes
index is the agent's own notes at that moment, the guidance lists the context tools the session can call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from proxy.errors import StoreError
from proxy.journal import Window
from proxy.windows.notes import bootstrap as boot
from proxy.windows.ports import WindowStore
from proxy.windows.session_tools import declared_in_tools, session_tools

FAMILY_TOOLS = {"history": boot.HISTORY_TOOLS, "notes": boot.NOTES_TOOLS, "context": boot.CONTEXT_TOOLS}
_last_reachable: list[Any] = [None, None, {}]  # the tools list last asked of, the families then, its part


def declared_tool_name(tool: Any) -> str | None:
    """A top-level function/custom tool's name as ctproxy knows it (Codex's `mcp__<server>__<tool>` mapped back).
    One shape of several: `reachable_context_tools` reads them all (proxy/windows/session_tools.py)."""
    if not isinstance(tool, dict) or tool.get("type") not in ("function", "custom") \
            or not isinstance(tool.get("name"), str):
        return None
    name = tool["name"]
    return name.rsplit("__", 1)[-1] if name.startswith("mcp__") else name


def reachable_context_tools(payload: dict[str, Any], families: Iterable[str]) -> tuple[str, ...]:
    """The context tools the session can call, however the client declares them (top-level, a namespace,
    `additional_tools`, a deferred namespace, a hosted `mcp` tool at ctproxy's /mcp) or bridged
    (`bridge.families`): a `boot.ToolNames` that also says how the model sees each. Every check of "which of
    ctproxy's tools can this session call" reads this. Asked several times of one request's `tools`: that part
    of the last answer is kept (the list is the request's own, never changed in place: ADR 0006); the input's
    few leading items are read each time (holding the input would keep a big one alive)."""
    tools = payload.get("tools")
    families = list(families)
    last = _last_reachable
    if last[0] is tools and tools is not None and last[1] == families:
        in_tools = last[2]
    else:
        in_tools = declared_in_tools(tools, families, FAMILY_TOOLS)
        if tools is not None:
            last[:] = [tools, families, in_tools]
    spelling = session_tools(payload, families, FAMILY_TOOLS, in_tools=in_tools)
    if not spelling:
        return ()
    seen = {k: v for k, v in spelling.items() if k != v}
    return boot.ToolNames(spelling, seen) if seen else tuple(spelling)


def notes_snapshot(store: WindowStore, task_id: str, address: str,
                   tools: tuple[str, ...] = boot.ALL_TOOLS) -> boot.NotesSnapshot:
    """The agent's own notes at a reset, from the state store; an unusable task id or directory gives "index
    unavailable". An agent that cannot read its notes (`tools`) gets the newest note's text in its bootstrap."""
    try:
        return boot.read_notes_index(store.notes(task_id), address, with_text="notes_read_file" not in tools)
    except (OSError, ValueError, StoreError):  # (StoreError: a shared store that cannot be reached)
        return boot.NotesSnapshot(address, None)


def window_notes_for(store: WindowStore, task_id: str, address: str, tools: tuple[str, ...],
                     reason: str) -> Callable[[Window | None, str], dict[str, Any]]:
    """For a remote/fallback window: the builder of its notes parts (`preface`, `coda` in its bootstrap)."""
    notes = notes_snapshot(store, task_id, address, tools)

    def build(prev: Window | None, window_id: str) -> dict[str, Any]:
        start = boot.WindowStart(address, window_id, prev.window_id if prev is not None else None, notes,
                                 tools=tools, task_id=task_id, reason=reason)
        head, tail = boot.window_notes(start)
        return {"preface": head, "coda": tail}

    return build
