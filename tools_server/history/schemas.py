"""The Codex schemas of the nine history/notes tools, frozen, and their runtime form.

Frozen from Codex `codex-rs/ext/history-notes/src/tools.rs` (namespaces `history` and `notes`,
flattened here to `history_*` / `notes_*`; research/peers.md §1.3). As in seed 000, the runtime
schema drops the four `"encrypted": true` marks (we do not ask the provider for encrypted
arguments; notes and the journal are local files protected by file permissions), and
`notes_read_file` keeps `offset_chars` / `limit_chars` beyond the Codex fields to page a long line.
Both differences are listed in `ADAPTATIONS` and checked by tests.
"""

from __future__ import annotations

import copy
from typing import Any

HISTORY_NAMESPACE_DESCRIPTION = ("Private conversation recovery; returned window/item IDs unchanged; new items may "
                                 "lag; no private state in user-facing output")
NOTES_NAMESPACE_DESCRIPTION = (
    "Private remote notes across windows; relative paths use current agent, absolute <agent>/notes/<path>; "
    "no shell expansion or empty, '.' or '..' components; 1,000,000 UTF-8 bytes/file; reads reflect completed "
    "writes, search/list may lag; await dependent same-path writes; no private state in user-facing output")
_AGENT = {"anyOf": [{"type": "string"}, {"type": "null"}],
          "description": "Omit for current agent; absolute or relative agent name"}
_ROLE = {"anyOf": [{"type": "string", "enum": ["user", "assistant", "tool", "system", "developer"]}, {"type": "null"}]}
_TOOL_FILTER = {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Excludes non-tool messages"}
_WINDOW = {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "Full returned ID; omit for all windows"}
_LINE = {"anyOf": [{"type": "integer"}, {"type": "null"}],
         "description": "Inclusive, 1-based; negative counts from end"}

# name → (Codex short description, Codex parameters exactly as frozen)
CODEX_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "history_list_windows": ("Context window IDs and item counts", {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "minimum": 1},
            "agent_name": _AGENT,
            "recent_first": {"type": "boolean"},
        },
    }),
    "history_list_items": ("Filtered history items", {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "minimum": 1},
            "recent_first": {"type": "boolean"},
            "tool_namespace": _TOOL_FILTER,
            "role": _ROLE,
            "agent_name": _AGENT,
            "tool_name": _TOOL_FILTER,
            "window_id": _WINDOW,
            "max_chars_per_item": {"type": "integer", "minimum": 1},
        },
    }),
    "history_read_item": ("Read a history item range", {
        "type": "object",
        "properties": {
            "agent_name": _AGENT,
            "item_id": {"type": "string", "description": "Suffix from the [id: …] marker"},
            "offset_chars": {"type": "integer", "minimum": 0, "description": "Zero-based"},
            "limit_chars": {"type": "integer", "minimum": 1},
            "window_id": {"type": "string", "description": "Full returned window ID"},
        },
        "required": ["item_id", "window_id"],
    }),
    "history_search_contents": ("Search history by literal substring", {
        "type": "object",
        "properties": {
            "limit": {"type": "integer", "minimum": 1},
            "query": {"type": "string", "encrypted": True, "description": "Case-sensitive literal substring"},
            "recent_first": {"type": "boolean"},
            "tool_namespace": _TOOL_FILTER,
            "role": _ROLE,
            "agent_name": _AGENT,
            "tool_name": _TOOL_FILTER,
            "window_id": _WINDOW,
        },
        "required": ["query"],
    }),
    "notes_list_files_by_prefix": ("List note paths", {
        "type": "object",
        "properties": {
            "prefix": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "max_results": {"type": "integer", "minimum": 1},
            "file_order_by": {"type": "string", "enum": ["name", "created_at", "updated_at"]},
            "file_order": {"type": "string", "enum": ["ascending", "descending"]},
        },
    }),
    "notes_read_file": ("Read note lines", {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "start_line": _LINE,
            "stop_line": _LINE,
        },
        "required": ["path"],
    }),
    "notes_search_contents": ("Search note lines by literal substring", {
        "type": "object",
        "properties": {
            "max_matches_per_file": {"type": "integer", "minimum": 1},
            "query": {"type": "string", "encrypted": True, "description": "Case-sensitive literal substring"},
            "recent_file_first": {"type": "boolean", "description": "By creation time"},
            "max_files": {"type": "integer", "minimum": 1},
            "path_prefix": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["query"],
    }),
    "notes_append_to_file": ("Append text exactly", {
        "type": "object",
        "properties": {
            "text": {"type": "string", "encrypted": True},
            "path": {"type": "string"},
        },
        "required": ["text", "path"],
    }),
    "notes_write_file": ("Create or replace a note", {
        "type": "object",
        "properties": {
            "text": {"type": "string", "encrypted": True},
            "path": {"type": "string"},
        },
        "required": ["text", "path"],
    }),
}

ENCRYPTED_FIELDS: tuple[tuple[str, str], ...] = (
    ("notes_write_file", "text"),
    ("notes_append_to_file", "text"),
    ("notes_search_contents", "query"),
    ("history_search_contents", "query"),
)
_READ_PAGING = {
    "offset_chars": {"type": "integer", "minimum": 0,
                     "description": "Zero-based code-point offset into the selected lines (pages a long line)"},
    "limit_chars": {"type": "integer", "minimum": 1, "description": "Code points to return from offset_chars"},
}
ADAPTATIONS = (
    "runtime schemas drop the four `encrypted: true` marks (ENCRYPTED_FIELDS)",
    "notes_read_file adds offset_chars / limit_chars",
)


def runtime_parameters(name: str) -> dict[str, Any]:
    """The JSON Schema a tool is registered with (a fresh copy)."""
    params = copy.deepcopy(CODEX_TOOLS[name][1])
    for tool, field in ENCRYPTED_FIELDS:
        if tool == name:
            params["properties"][field].pop("encrypted", None)
    if name == "notes_read_file":
        params["properties"].update(copy.deepcopy(_READ_PAGING))
    return params


def description(name: str) -> str:
    short = CODEX_TOOLS[name][0]
    ns = HISTORY_NAMESPACE_DESCRIPTION if name.startswith("history_") else NOTES_NAMESPACE_DESCRIPTION
    return f"{short}. {ns}."


def field_owners() -> dict[str, list[str]]:
    """field name → the tools whose runtime schema has it (for 'belongs to another tool' errors)."""
    owners: dict[str, list[str]] = {}
    for name in CODEX_TOOLS:
        for field in runtime_parameters(name)["properties"]:
            owners.setdefault(field, []).append(name)
    return owners
