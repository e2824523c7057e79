"""Canonical items and the hash chain of item ids (pure).

A client resends the conversation each turn, often not byte for byte what the model produced:
upstream ids stripped, `status`/`annotations`/`logprobs` dropped, string content instead of parts.
The canonical form removes exactly those differences, so an item keeps its id across resends,
and any real edit (text, arguments, call ids, images) changes it.

id(item) = "it_" + sha256(parent id | session root, canonical hash)[:16] — the same item under the
same parent in the same session always gets the same id; an edit gets a new id from that point on.

This is the one canonical form and the one hash chain of the proxy (ADR 0006): the journal's item ids
and branch detection, and a window's boundary (`chain_ids`, checked by the context projection,
`proxy/windows/apply.py`) are the same function, so they cannot disagree about an item. Decided:
- `id` and `status` (and the other `_VOLATILE_ITEM_KEYS`) never count: an agent that resends items
  without upstream ids or statuses still matches; two items that differ only there are the same item.
- `encrypted_content` of a `reasoning` item does not count (clients keep or drop it with `include`;
  the summary is what the item says). Of any other item it counts: for a `compaction` item it is the
  whole content, and a different opaque blob is a different item.
- string content and a list of text parts are the same message; part annotations/logprobs never count.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from proxy.items.lazyitems import LazyItems

try:
    # CPython's own SHA-256 (the same digests as hashlib's): measured on the proxy, hashlib's OpenSSL
    # object costs ≈35 µs a call from a cold cache against ≈15 µs, and every turn hashes a few items.
    from _sha2 import sha256
except ImportError:  # pragma: no cover - another interpreter
    from hashlib import sha256

# Fields a client may drop or rewrite on resend without changing what the item says.
_VOLATILE_ITEM_KEYS = frozenset({"id", "status", "phase", "internal_chat_message_metadata_passthrough",
                                 "caller", "created_by"})
_VOLATILE_PART_KEYS = frozenset({"annotations", "logprobs", "prompt_cache_breakpoint"})
# Output item types a client may legitimately leave out when it resends (stateless reasoning, hosted
# tool traces); skipping them on the branch is not an edit. `mcp_call`: a hosted MCP call's trace, and the
# form of the calls ctproxy itself ran (the bridge's, the checkpoint turn's note write), which an agent
# that knows no such item drops, or never saw.
SKIPPABLE_TYPES = frozenset({"reasoning", "web_search_call", "file_search_call", "image_generation_call",
                             "code_interpreter_call", "mcp_list_tools", "mcp_call"})
COMPACTION_TYPES = frozenset({"compaction", "compaction_summary", "context_compaction"})


# One str object per known type name: a branch keeps each item's type for as long as its session is cached, and
# orjson.loads makes a new str for every value it reads (100,000 items: 100,000 copies of "message").
_TYPE_NAMES = {t: t for t in (*SKIPPABLE_TYPES, *COMPACTION_TYPES, "message", "function_call", "function_call_output",
                               "custom_tool_call", "custom_tool_call_output", "local_shell_call",
                               "local_shell_call_output", "shell_call", "shell_call_output", "apply_patch_call",
                               "apply_patch_call_output", "computer_call", "computer_call_output", "item_reference",
                               "mcp_approval_request", "mcp_approval_response", "tool_search_call",
                               "tool_search_output")}


def type_name(typ: str) -> str:
    """The one str object of a known type name (`typ` itself for another)."""
    return _TYPE_NAMES.get(typ, typ)


def item_type(item: Any) -> str:
    """The item's type; an EasyInputMessage (`{role, content}`) is a message."""
    if isinstance(item, dict):
        typ = item.get("type")
        if isinstance(typ, str):
            return _TYPE_NAMES.get(typ, typ)
        if "role" in item:
            return "message"
    return "unknown"


def _canon_part(part: Any, role: str | None) -> Any:
    if isinstance(part, str):
        return {"type": "output_text" if role == "assistant" else "input_text", "text": part}
    if isinstance(part, dict):
        return {k: v for k, v in part.items() if k not in _VOLATILE_PART_KEYS}
    return part


def _canon_content(content: Any, role: str | None) -> Any:
    if isinstance(content, str):
        return [_canon_part(content, role)]
    if isinstance(content, list):
        return [_canon_part(p, role) for p in content]
    return content


def input_items(payload: Mapping[str, Any]) -> list[Any] | LazyItems:
    """The request's input as a list of items (a string input is one user message); a big body's may be a
    `LazyItems`, not built (proxy/items/lazyitems.py)."""
    inp = payload.get("input")
    if isinstance(inp, str):
        return [{"role": "user", "content": inp}]
    if isinstance(inp, (list, LazyItems)):
        return inp
    return []


def canonical_item(item: Any) -> Any:
    """The comparable form of an item (a new object; the input is not modified)."""
    if not isinstance(item, dict):
        return item
    typ = item_type(item)
    out = {k: v for k, v in item.items() if k not in _VOLATILE_ITEM_KEYS}
    out["type"] = typ
    if typ == "message":
        role = item.get("role") if isinstance(item.get("role"), str) else None
        out["content"] = _canon_content(item.get("content"), role)
    elif typ == "reasoning":
        # Clients drop or keep encrypted_content depending on `include`; the summary is what it says.
        out.pop("encrypted_content", None)
        out.setdefault("summary", [])
        out["summary"] = _canon_content(out["summary"], "assistant")
        if "content" in out:
            out["content"] = _canon_content(out["content"], "assistant")
            if not out["content"]:
                out.pop("content")
    elif typ in ("function_call_output", "custom_tool_call_output") and isinstance(item.get("output"), list):
        out["output"] = _canon_content(item["output"], None)
    return out


def canonical_hash(item: Any) -> str:
    data = orjson.dumps(canonical_item(item), option=orjson.OPT_SORT_KEYS)
    return sha256(data).hexdigest()


def canonical_digest(item: Any) -> bytes:
    """`canonical_hash` as its 32 bytes (`canonical_digest(x).hex() == canonical_hash(x)`)."""
    return sha256(orjson.dumps(canonical_item(item), option=orjson.OPT_SORT_KEYS)).digest()


def session_root(session_key: str) -> str:
    return "root:" + session_key


def chain_id(parent: str, canon: str) -> str:
    """The id of an item with canonical hash `canon` under `parent` (an item id or a session root)."""
    return "it_" + sha256(f"{parent}\x00{canon}".encode()).hexdigest()[:16]


def chain_digest(parent: str, canon: str) -> bytes:
    """`chain_id`'s 16 hex digits as their 8 bytes (an id in proxy/journal/itemids.ItemIds)."""
    return sha256(f"{parent}\x00{canon}".encode()).digest()[:8]


def chain_ids(items: Sequence[Any], root: str, upto: int | None = None) -> list[str]:
    """The chain ids of the first `upto` items (all by default) hanging from `root` (a session root or
    an item id): the ids the journal gives them when it journals them there, in that order."""
    n = len(items) if upto is None else min(upto, len(items))
    out: list[str] = []
    parent = root
    for i in range(n):
        parent = chain_id(parent, canonical_hash(items[i]))
        out.append(parent)
    return out


def chain_at(items: Sequence[Any], root: str, n: int) -> str | None:
    """The chain id of item n-1 (what a boundary after n items is checked against); None when n == 0 or
    there are fewer items."""
    if n <= 0 or n > len(items):
        return None
    return chain_ids(items, root, n)[-1]


LEGACY_PREFIX = "v1:"


def legacy_chain_hash(items: Sequence[Any], n: int) -> str | None:
    """The hash chain compaction checkpoints used before the one window model (ids and status dropped,
    nothing else canonical), prefixed `v1:`. Kept only for a window migrated from a checkpoint whose
    items were not in the journal (history was off): its boundary can be checked no other way."""
    if n <= 0 or n > len(items):
        return None
    prev = b""
    for i in range(n):
        item = items[i]
        if isinstance(item, dict) and ("id" in item or "status" in item):
            item = {k: v for k, v in item.items() if k not in ("id", "status")}
        prev = sha256(prev + orjson.dumps(item, option=orjson.OPT_SORT_KEYS)).digest()
    return LEGACY_PREFIX + prev.hex()


def fingerprint(raw: bytes) -> int:
    """A cheap in-process fingerprint of an item's bytes exactly as sent (fast path for resends): its length and
    its 64-bit hash in one int (one object per branch entry, where a (length, hash) tuple was three)."""
    return len(raw) << 64 | hash(raw) & 0xFFFF_FFFF_FFFF_FFFF
