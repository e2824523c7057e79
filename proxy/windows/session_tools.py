"""Which of ctproxy's context tools a session can call, and how the model sees each one (issue 46 (1), issue 44
(2)): one pure walk over every shape the Responses API and its clients use to declare tools.

- top-level `function` and `custom` tools: `history_read_item`, or Codex's flat `mcp__<server>__history_read_item`;
- a `namespace` tool (Codex's `{"type": "namespace", "name": "mcp__ctproxy", "tools": […]}`): seen as
  `mcp__ctproxy.history_read_item`;
- the same shapes inside Codex's leading `additional_tools` input items (its Responses-lite path);
- a namespace of ctproxy's that Codex defers (code mode: the model loads it through `exec`), named in a leading
  developer message as "Deferred tool namespaces: mcp__ctproxy": every context tool, seen as `exec` names it
  (`tools.mcp__ctproxy__history_read_item`: `mcp__ctproxy__history_read_item`);
- a hosted `mcp` tool whose `server_url` is ctproxy's tool server `/mcp` (its `allowed_tools`, when given);
- the bridge's own families (ctproxy offers those itself, under their own names).

The result maps each of ctproxy's names (`history_read_item`) to the spelling the model knows it by; only the
context tools (`proxy.windows.notes.bootstrap.ALL_TOOLS`) are reported.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from proxy.items.inputs import leading_additional_tools
from proxy.windows.notes.bootstrap import ALL_TOOLS

_OWN = frozenset(ALL_TOOLS)
OWN_NAMESPACES = frozenset({"mcp__ctproxy", "ctproxy"})  # Codex's MCP namespace for ctproxy; the bridge's label
# Codex 0.171: "<tools>\nDeferred tool namespaces:\n- mcp__ctproxy\n</tools>" (a bullet per namespace); a
# comma-separated list on the same line is read too.
_DEFERRED = re.compile(r"Deferred tool namespaces:[ \t]*([^\n]*(?:\n[ \t]*[-*][ \t]*[^\n]*)*)")
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
_LEADING_SCAN = 8  # Codex's leading developer messages are few; a long input is never walked for this


def _flat_name(name: str) -> str:
    """Codex's flat spelling of an MCP tool (`mcp__<server>__<tool>`) mapped back to the tool's own name."""
    return name.rsplit("__", 1)[-1] if name.startswith("mcp__") else name


def _own_mcp_url(url: Any, mcp_urls: frozenset[str]) -> bool:
    if not isinstance(url, str):
        return False
    if url.rstrip("/") in mcp_urls:
        return True
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    # With no URL given (a caller that does not know the tool server's port): a loopback /mcp is ctproxy's.
    return not mcp_urls and parts.hostname in _LOOPBACK and parts.path.rstrip("/") == "/mcp"


def _allowed(tool: Mapping[str, Any]) -> frozenset[str] | None:
    allowed = tool.get("allowed_tools")
    if isinstance(allowed, list):
        return frozenset(n for n in allowed if isinstance(n, str))
    if isinstance(allowed, Mapping) and isinstance(names := allowed.get("tool_names"), list):
        return frozenset(n for n in names if isinstance(n, str))
    return None


def _walk(tools: Iterable[Any], out: dict[str, str], mcp_urls: frozenset[str], namespace: str | None = None) -> None:
    for tool in tools:
        if not isinstance(tool, Mapping):
            continue
        kind = tool.get("type")
        name = tool.get("name")
        if kind in ("function", "custom") and isinstance(name, str):
            own = _flat_name(name)
            if own in _OWN:
                out.setdefault(own, f"{namespace}.{name}" if namespace else name)
        elif kind == "namespace" and isinstance(name, str) and isinstance(inner := tool.get("tools"), list):
            _walk(inner, out, mcp_urls, name)
        elif kind == "mcp" and _own_mcp_url(tool.get("server_url"), mcp_urls):
            allowed = _allowed(tool)
            for own in ALL_TOOLS:
                if allowed is None or own in allowed:
                    out.setdefault(own, own)


def _deferred_namespaces(payload: Mapping[str, Any]) -> list[str]:
    """The namespaces a leading developer/system message says are deferred (Codex's code mode)."""
    inp = payload.get("input")
    if isinstance(inp, str) or inp is None:
        return []
    found: list[str] = []
    try:
        lead = [inp[k] for k in range(min(len(inp), _LEADING_SCAN))]  # (a big body's lazy list: these items only)
    except (TypeError, IndexError, KeyError):
        return []
    for item in lead:
        if not isinstance(item, Mapping):
            break
        if item.get("type") == "additional_tools":
            continue
        if item.get("type", "message") != "message" or item.get("role") not in ("developer", "system"):
            break
        content = item.get("content")
        parts = [content] if isinstance(content, str) else [
            p.get("text") for p in content if isinstance(p, Mapping)] if isinstance(content, list) else []
        for text in parts:
            if isinstance(text, str) and "Deferred tool namespaces:" in text:
                for block in _DEFERRED.findall(text):
                    for line in block.splitlines():
                        found += [n.strip(" \t-*`'\".") for n in line.split(",")]
    return found


def declared_in_tools(tools: Any, families: Iterable[str], family_tools: Mapping[str, Iterable[str]],
                      mcp_urls: Iterable[str] = ()) -> dict[str, str]:
    """The context tools of a request's top-level `tools` and of the bridged `families`: {ctproxy's name: the
    name the model sees}."""
    found: dict[str, str] = {}
    if isinstance(tools, list):
        _walk(tools, found, frozenset(u.rstrip("/") for u in mcp_urls))
    for fam in families:  # the bridge serves these under their own names
        for own in family_tools.get(fam, ()):
            found.setdefault(own, own)
    return found


def declared_in_input(payload: Mapping[str, Any], mcp_urls: Iterable[str] = ()) -> dict[str, str]:
    """The context tools a request declares in its leading input items: Codex's `additional_tools` items and
    the deferred namespaces its developer messages name. Only the leading items are read."""
    found: dict[str, str] = {}
    _walk(leading_additional_tools(payload), found, frozenset(u.rstrip("/") for u in mcp_urls))
    for ns in _deferred_namespaces(payload):
        if ns in OWN_NAMESPACES:  # loaded in code mode, where `exec` calls them as tools.mcp__ctproxy__<tool>
            for own in ALL_TOOLS:
                found.setdefault(own, f"{ns}__{own}")
    return found


def session_tools(payload: Mapping[str, Any], families: Iterable[str], family_tools: Mapping[str, Iterable[str]],
                  mcp_urls: Iterable[str] = (), in_tools: Mapping[str, str] | None = None) -> dict[str, str]:
    """ctproxy's context tools this request's session can call: {ctproxy's name: the name the model sees}, in
    ALL_TOOLS order. `families`: the bridged ones (`bridge.families`), named by `family_tools`; `mcp_urls`: the
    tool server's `/mcp` URL(s), when known; `in_tools`: `declared_in_tools` of this request, when known."""
    top = in_tools if in_tools is not None else declared_in_tools(payload.get("tools"), families, family_tools,
                                                                  mcp_urls)
    found = {**declared_in_input(payload, mcp_urls), **top}  # a top-level declaration's spelling first
    return {n: found[n] for n in ALL_TOOLS if n in found}
