"""Roles, tool namespace/name and control marks of journal items (pure; seed 000).

- outputs of tools (`function_call_output`, `custom_tool_call_output`, …) → `tool`;
  items the model produced (calls, reasoning, hosted tool traces) → `assistant`;
  messages keep the role they were sent with; compaction items → `user`.
- a call's namespace/name come from the call (Codex's `namespace` field when present); plain tools
  are `functions`; the proxy's own flat `history_*`/`notes_*` map back to `history`/`notes`, by
  whatever road they came: a bare name, a bridged `mcp_call` (server label `ctproxy`), or Codex's MCP
  spelling (`mcp__ctproxy__notes_write_file`, or namespace `mcp__ctproxy`); the window tools
  (`get_context_remaining`, `new_context`) likewise map to `functions`. So the recovery tools' own
  records are hidden from default list/search whatever road they came by (seed 000), and a bridged
  notes write answers to `tool_namespace: notes`.
  Outputs take the namespace/name of their call (by `call_id`, resolved by the writer).
- control messages are the ones the proxy injects: their text starts with `<ctp_`.
"""

from __future__ import annotations

from typing import Any

from proxy.items.canonical import COMPACTION_TYPES, item_type
from proxy.items.contextual import CONTEXTUAL_FRAGMENTS

ROLES = ("user", "assistant", "tool", "system", "developer")
CONTROL_PREFIX = "<ctp_"
FUNCTIONS = "functions"
CONCEPT_NAMESPACES = ("history", "notes")
# Window-control tools hidden from default list/search, like the history/notes namespaces.
CONTEXT_TOOLS = frozenset({"get_context_remaining", "new_context"})
CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
# ctproxy's own tools as other roads name them: the bridge's mcp_call server label, Codex's MCP namespace
# for the server `ctproxy codex-config` writes, and Codex's flat MCP spelling of a tool name.
OWN_NAMESPACES = frozenset({"ctproxy", "mcp__ctproxy"})
CODEX_OWN_PREFIX = "mcp__ctproxy__"
_TOOL_OUTPUT_TYPES = frozenset({
    "function_call_output", "custom_tool_call_output", "computer_call_output", "local_shell_call_output",
    "shell_call_output", "apply_patch_call_output", "tool_search_output", "mcp_approval_response",
})
_HOSTED_CALLS = frozenset({
    "web_search_call", "file_search_call", "image_generation_call", "code_interpreter_call",
    "computer_call", "local_shell_call", "shell_call", "apply_patch_call", "tool_search_call",
})


def role_of(item: Any) -> str | None:
    typ = item_type(item)
    if typ == "message":
        role = item.get("role")
        return role if role in ROLES else "user"
    if typ in _TOOL_OUTPUT_TYPES:
        return "tool"
    if typ in COMPACTION_TYPES:
        return "user"
    if typ == "item_reference":
        return None
    return "assistant"


def normalize_tool(namespace: str | None, name: str | None) -> tuple[str | None, str | None]:
    """(namespace, name) as the journal stores them; flat history_*/notes_* map to their concept."""
    if isinstance(name, str) and (namespace in OWN_NAMESPACES or name.startswith(CODEX_OWN_PREFIX)):
        bare = name.removeprefix(CODEX_OWN_PREFIX)
        for concept in CONCEPT_NAMESPACES:
            if bare.startswith(concept + "_"):
                return concept, bare[len(concept) + 1:]
        if bare in CONTEXT_TOOLS:
            return FUNCTIONS, bare
    if isinstance(name, str):
        for concept in CONCEPT_NAMESPACES:
            prefix = concept + "_"
            if name.startswith(prefix) and namespace in (None, "", FUNCTIONS, concept):
                return concept, name[len(prefix):]
    if name is not None and not namespace:
        namespace = FUNCTIONS
    return namespace or None, name


def tool_of(item: Any) -> tuple[str | None, str | None]:
    """The tool identity an item carries by itself (calls; outputs only through their own `name`)."""
    typ = item_type(item)
    if typ in CALL_TYPES:
        ns = item.get("namespace") if isinstance(item.get("namespace"), str) else None
        name = item.get("name") if isinstance(item.get("name"), str) else None
        return normalize_tool(ns, name)
    if typ in _HOSTED_CALLS:
        return FUNCTIONS, typ.removesuffix("_call")
    if typ == "mcp_call":
        name = item.get("name") if isinstance(item.get("name"), str) else None
        return normalize_tool(item.get("server_label") or "mcp", name)
    if typ in _TOOL_OUTPUT_TYPES and isinstance(item.get("name"), str):
        return normalize_tool(None, item["name"])
    return None, None


def is_output(item: Any) -> bool:
    return item_type(item) in _TOOL_OUTPUT_TYPES


def call_id_of(item: Any) -> str | None:
    cid = item.get("call_id") if isinstance(item, dict) else None
    return cid if isinstance(cid, str) and cid else None


def is_hidden_tool(namespace: str | None, name: str | None) -> bool:
    """Records of the recovery tools themselves, hidden from default list/search (no recursion)."""
    return namespace in CONCEPT_NAMESPACES or (namespace == FUNCTIONS and name in CONTEXT_TOOLS)


def is_control(item: Any) -> bool:
    """A message nobody typed, hidden from default list/search and so from `role: user` (seed 000 defect
    9): what the proxy injects (`<ctp_…>`), and the user-role context a client injects, recognised as
    Codex recognises its own "contextual" user messages (proxy.items.contextual.CONTEXTUAL_FRAGMENTS:
    `<environment_context>`, `# AGENTS.md instructions …`, `<user_instructions>`, `<turn_aborted>`, …)
    at the start of the message. The rule, and why Pi's and the SDKs' messages need none: docs/history.md."""
    if item_type(item) != "message":
        return False
    content = item.get("content")
    first: Any = content
    if isinstance(content, list):
        first = next((p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)),
                     None)
    if not isinstance(first, str):
        return False
    head = first.lstrip()
    if head.startswith(CONTROL_PREFIX):
        return True
    return item.get("role", "user") == "user" and head.startswith(CONTEXTUAL_FRAGMENTS)
