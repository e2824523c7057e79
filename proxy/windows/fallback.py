"""The readable fallback of a compaction (seed 004 §5.2): a unique marker plus a deterministic
transcript excerpt of at most 12,000 characters (head and tail with an omission mark).

Used whenever the opaque compaction item may not be replayed (other model, account, endpoint or
auth kind, feature off) and when a remote compaction fails.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from proxy.items.canonical import item_type
from proxy.items.inputs import COMPACTION_ITEM_TYPES, is_message, text_parts

EXCERPT_LIMIT = 12_000
HEAD_FRACTION = 0.35
ENTRY_LIMIT = 2_000  # one huge tool output must not push every other turn out of the excerpt
EARLIER_LIMIT = 6_000  # an earlier checkpoint's excerpt, carried into the next one
MARKER_PREFIX = "[ctproxy-compaction:v1:"
_MARKER = re.compile(r"\[ctproxy-compaction:v1:[A-Za-z0-9_-]{1,64}\]")
OPEN_TAG = "<ctproxy-compaction-fallback>"
CLOSE_TAG = "</ctproxy-compaction-fallback>"
PREAMBLE = (
    "The earlier part of this conversation was compacted. A transcript excerpt of it follows "
    "(start and end kept, middle omitted); continue the task from it."
)


def marker(checkpoint_id: str) -> str:
    return f"{MARKER_PREFIX}{checkpoint_id}]"


def _cut_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    mark = f" …[{len(text) - limit} characters omitted]… "
    keep = max(0, limit - len(mark))
    head = keep // 2
    return text[:head] + mark + text[len(text) - (keep - head):]


def _content_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        parts = []
        for p in value:
            if isinstance(p, dict):
                if isinstance(p.get("text"), str):
                    parts.append(p["text"])
                elif str(p.get("type", "")).endswith("image"):
                    parts.append("[image]")
                elif str(p.get("type", "")).endswith("file"):
                    parts.append("[file]")
            elif isinstance(p, str):
                parts.append(p)
        return " ".join(parts)
    return ""


def _render_item(item: Any) -> str | None:
    if not isinstance(item, dict):
        return None
    typ = item_type(item)
    if is_message(item):
        text = "\n".join(text_parts(item))
        if is_fallback_text(text):
            return "[earlier compacted transcript]\n" + _cut_middle(_inner_excerpt(text), EARLIER_LIMIT)
        body = _content_text(item.get("content"))
        return f"{item.get('role', 'user')}: {body}" if body else None
    name = item.get("name") if isinstance(item.get("name"), str) else "tool"
    if isinstance(item.get("namespace"), str):
        name = f"{item['namespace']}.{name}"
    if typ == "function_call":
        return f"assistant called {name}({item.get('arguments', '')})"
    if typ == "custom_tool_call":
        return f"assistant called {name}: {item.get('input', '')}"
    if typ in ("function_call_output", "custom_tool_call_output"):
        return f"tool result: {_content_text(item.get('output'))}"
    if typ == "reasoning":
        summary = _content_text(item.get("summary"))
        return f"assistant reasoning: {summary}" if summary else None
    if typ == "web_search_call":
        action = item.get("action") if isinstance(item.get("action"), dict) else {}
        query = action.get("query") or " | ".join(q for q in action.get("queries") or [] if isinstance(q, str))
        return f"web search: {query}" if query else "web search"
    if typ in COMPACTION_ITEM_TYPES or typ == "context_compaction":
        return "[earlier context, compacted]"
    return f"[{typ}]"


def _inner_excerpt(text: str) -> str:
    """The excerpt inside an earlier fallback, without its marker (so markers never nest)."""
    start, end = text.find(OPEN_TAG), text.rfind(CLOSE_TAG)
    if start != -1 and end > start:
        text = text[start + len(OPEN_TAG):end]
    return _MARKER.sub("", text).strip()


def render_transcript(items: Sequence[Any]) -> str:
    """One entry per item, in order; opaque data (encrypted content, images) is never rendered."""
    lines = []
    for item in items:
        entry = _render_item(item)
        if entry:
            limit = EARLIER_LIMIT + 40 if entry.startswith("[earlier compacted transcript]") else ENTRY_LIMIT
            lines.append(_cut_middle(entry, limit))
    return "\n\n".join(lines)


def excerpt(text: str, limit: int = EXCERPT_LIMIT) -> str:
    """At most `limit` characters: the first ~35% and the rest from the end, with an omission mark."""
    if len(text) <= limit:
        return text
    omitted = len(text)
    mark = f"\n\n…[{omitted} characters omitted]…\n\n"
    for _ in range(3):  # the mark's own length depends on the count it reports
        keep = limit - len(mark)
        head = int(keep * HEAD_FRACTION)
        tail = keep - head
        omitted = len(text) - head - tail
        mark = f"\n\n…[{omitted} characters omitted]…\n\n"
    keep = limit - len(mark)
    head = int(keep * HEAD_FRACTION)
    tail = keep - head
    return text[:head] + mark + text[len(text) - tail:]


def fallback_text(checkpoint_id: str, items: Sequence[Any], limit: int = EXCERPT_LIMIT) -> str:
    """The marker line followed by the bounded excerpt of the covered items."""
    body = excerpt(render_transcript(items), limit)
    return f"{marker(checkpoint_id)}\n{PREAMBLE}\n{OPEN_TAG}\n{body}\n{CLOSE_TAG}"


def shrink_fallback_text(text: str, max_bytes: int) -> str:
    """The same fallback (marker, preamble, tags) with its excerpt cut to fit `max_bytes` (UTF-8);
    the excerpt may end up empty, the marker always stays."""
    start, end = text.find(OPEN_TAG), text.rfind(CLOSE_TAG)
    if start == -1 or end <= start or len(text.encode()) <= max_bytes:
        return text
    head, inner, tail = text[:start + len(OPEN_TAG)], text[start + len(OPEN_TAG):end], text[end:]
    room = max_bytes - len(head.encode()) - len(tail.encode())
    limit = min(len(inner), room)
    while limit > 0:
        cut = excerpt(inner.strip("\n"), limit) if limit >= 200 else ""
        if len(cut.encode()) + 2 <= room:
            return f"{head}\n{cut}\n{tail}" if cut else f"{head}\n{tail}"
        limit = int(limit * 0.9)
    return f"{head}\n{tail}"


def fallback_message(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def is_fallback_text(text: str) -> bool:
    return MARKER_PREFIX in text and bool(_MARKER.search(text))


def is_fallback_message(item: Any) -> bool:
    return is_message(item) and any(is_fallback_text(t) for t in text_parts(item))
