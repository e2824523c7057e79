"""Helpers over Responses input items: roles and text, byte-based token estimates, the item hash chain
(the one chain of proxy/items/canonical.py, ADR 0006).

Pure functions; nothing here mutates an item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import orjson

from proxy.items.lazyitems import LazyItems, as_list, positions_of

Item = dict[str, Any]

# Item types that mean the client runs compaction itself (Codex v2 trigger, opaque items, legacy v2).
CLIENT_COMPACTION_TYPES: frozenset[str] = frozenset(
    {"compaction_trigger", "compaction", "compaction_summary", "context_compaction"}
)
COMPACTION_ITEM_TYPES: frozenset[str] = frozenset({"compaction", "compaction_summary"})
BYTES_PER_TOKEN = 4


def approx_tokens_for_bytes(n: int) -> int:
    """Codex's estimate: ceil(bytes / 4)."""
    return (max(0, n) + BYTES_PER_TOKEN - 1) // BYTES_PER_TOKEN


def approx_tokens(text: str) -> int:
    return approx_tokens_for_bytes(len(text.encode("utf-8")))


def input_items(payload: Mapping[str, Any]) -> list[Item] | LazyItems | None:
    """The input as a list of items; a string input is one user message. None when unknown. A big body's
    list may be a `LazyItems` (proxy/items/lazyitems.py) where the stage read the body's `view`."""
    inp = payload.get("input")
    if isinstance(inp, (list, LazyItems)):
        return inp
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    return None


ADDITIONAL_TOOLS = "additional_tools"  # Codex ≥ 0.144 (0.150 outside "lite" models): its tools as an input item


def leading_additional_tools(payload: Mapping[str, Any]) -> list[Any]:
    """The tools of the request's leading `{"type": "additional_tools", "role": "developer", "tools": […]}`
    input items: the agent's tools as Codex may send them instead of top-level `tools` (research
    anchors-2026-12-03 §2.3). Only the leading items are read (a big input is not built); the items
    themselves are never changed: they reach the upstream as sent."""
    inp = payload.get("input")
    out: list[Any] = []
    if isinstance(inp, str) or inp is None:
        return out
    try:
        for item in inp:
            if not isinstance(item, Mapping) or item.get("type") != ADDITIONAL_TOOLS:
                break
            if isinstance(tools := item.get("tools"), list):
                out.extend(tools)
    except TypeError:
        return []
    return out


def is_message(item: Any) -> bool:
    return isinstance(item, dict) and (item.get("type") == "message" or ("type" not in item and "role" in item))


def role_of(item: Any) -> str | None:
    return item.get("role") if is_message(item) and isinstance(item.get("role"), str) else None


def text_parts(item: Item) -> list[str]:
    """The text of a message's parts (input_text / output_text / text), in order."""
    content = item.get("content")
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
    return out


def item_bytes(item: Any) -> int:
    return len(orjson.dumps(item))


def items_bytes(items: Sequence[Any]) -> int:
    """Serialized size of the items (one orjson call: the brackets and commas are noise)."""
    return len(orjson.dumps(items if isinstance(items, list) else as_list(items) if isinstance(items, LazyItems)
                            else list(items)))


@dataclass(frozen=True, slots=True)
class InputFacts:
    """What several stages ask of every input item, found in one pass over a (2,000-item) input."""

    client_compaction: bool  # an item of a type that means the client compacts itself
    instructions: tuple[int, ...]  # positions of the system/developer items (where guidance and reminders are)


def input_facts(items: Sequence[Any]) -> InputFacts:
    # every item a dict (the usual case): the per-item work runs in C, at ≈0.1 µs an item; a big body's list not
    # built yet is read from its views the same way (proxy/items/lazyitems.py)
    if isinstance(items, LazyItems) and items.materialized is None:
        summary = items.type_summary()
        if summary is None:
            return _input_facts_walk(items)
        return InputFacts(not summary[0].isdisjoint(CLIENT_COMPACTION_TYPES), summary[1])
    try:
        types = set(map(dict.get, items, repeat("type")))
        roles = list(map(dict.get, items, repeat("role")))
    except TypeError:  # some item is not a dict, or has an unhashable type
        return _input_facts_walk(items)
    instructions = tuple(positions_of(roles, ("developer", "system")))
    return InputFacts(not types.isdisjoint(CLIENT_COMPACTION_TYPES), instructions)


def _input_facts_walk(items: Sequence[Any]) -> InputFacts:
    compaction = False
    instructions: list[int] = []
    for k, item in enumerate(items):
        if isinstance(item, dict):
            typ = item.get("type")
            if isinstance(typ, str) and typ in CLIENT_COMPACTION_TYPES:
                compaction = True
            role = item.get("role")
            if role == "developer" or role == "system":
                instructions.append(k)
    return InputFacts(compaction, tuple(instructions))


def client_compacts(payload: dict[str, Any], facts: InputFacts | None = None) -> bool:
    """The client handles compaction itself: it sends a trigger or carries compaction items, or asks
    for server-side compaction with `context_management`. `facts`: the input's, when already known."""
    if isinstance(payload.get("context_management"), list) and payload["context_management"]:
        return True
    if facts is not None:
        return facts.client_compaction
    items = input_items(payload) or []
    # (a `type` that is no string, a list say, is no compaction type: never a TypeError from the set)
    return any(isinstance(i, dict) and isinstance(t := i.get("type"), str) and t in CLIENT_COMPACTION_TYPES
               for i in items)
