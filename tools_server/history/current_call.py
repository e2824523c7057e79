"""Which journal item is the call being executed, when the transport did not say (MCP).

Over REST the caller names it (`x-ctp-call-id`) and the bridge knows it; an MCP client (Codex CLI)
sends only the tool's name and arguments. The model's call is journaled when its response completed,
before the client could run it, so the current call is the newest call item of the caller's sessions
that names this tool (bare, or namespaced as `mcp__<server>__<tool>`) with exactly these arguments.
A call that is not journaled (yet) is not found: then nothing is excluded, never the wrong item.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.journal.query import HistoryReader

_CALL_TYPES = ("function_call", "custom_tool_call", "mcp_call")
_LOOK_BACK = 64  # the newest call items examined: the current call is among the last few


def _names_tool(name: Any, tool: str) -> bool:
    if not isinstance(name, str):
        return False
    return name == tool or any(name.endswith(sep + tool) for sep in ("__", ".", "/"))


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def current_call_id(reader: HistoryReader, task_id: str, address: str, tool: str,
                    arguments: dict[str, Any]) -> str | None:
    keys = reader.sessions(task_id, address)
    if not keys:
        return None
    want = _without_nulls(arguments)
    for call_id, raw in reader.recent_calls(keys, tuple(_CALL_TYPES), _LOOK_BACK):
        try:
            item = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(item, dict) or not _names_tool(item.get("name"), tool):
            continue
        raw_args = item.get("arguments", item.get("input"))
        try:
            parsed = orjson.loads(raw_args) if isinstance(raw_args, str) else raw_args
        except orjson.JSONDecodeError:
            continue
        if isinstance(parsed, dict) and _without_nulls(parsed) == want:
            return call_id
    return None
