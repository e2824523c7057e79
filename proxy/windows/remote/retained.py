"""The retained user-message window of a remote compaction, as Codex builds it (codex-protocol.md §1.4).

Only real user messages are kept: developer/system messages, assistant output, tool traffic,
contextual user messages (AGENTS.md, environment context, …) and our own fallback messages are
dropped. Walking newest to oldest within 64,000 approximate tokens, a message that fits is kept
whole, the first one that does not fit is middle-truncated to the remaining budget, older ones are
dropped; the result is in chronological order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.items.contextual import CONTEXTUAL_FRAGMENTS
from proxy.items.inputs import approx_tokens, role_of, text_parts
from proxy.windows.fallback import is_fallback_message

RETAINED_MESSAGE_TOKEN_BUDGET = 64_000

def is_real_user_message(item: Any) -> bool:
    if role_of(item) != "user" or is_fallback_message(item):
        return False
    return not any(frag in text for text in text_parts(item) for frag in CONTEXTUAL_FRAGMENTS)


def _cost(item: dict[str, Any]) -> int:
    return max(1, sum(approx_tokens(t) for t in text_parts(item)))


def truncate_middle_bytes(text: str, max_bytes: int) -> tuple[str, int]:
    """Keep about max_bytes/2 from each end (on UTF-8 boundaries); returns (text, tokens removed)."""
    raw = text.encode("utf-8")
    if len(raw) <= max_bytes:
        return text, 0
    half = max(0, max_bytes // 2)
    head = raw[:half].decode("utf-8", errors="ignore")
    tail = raw[len(raw) - half:].decode("utf-8", errors="ignore") if half else ""
    removed = approx_tokens(text) - approx_tokens(head) - approx_tokens(tail)
    return f"{head}…{max(removed, 1)} tokens truncated…{tail}", max(removed, 1)


def _truncate_message(item: dict[str, Any], budget: int) -> dict[str, Any]:
    """Cut the text parts in order to `budget` tokens: later text parts go, images stay."""
    content = item.get("content")
    if isinstance(content, str):
        return {**item, "content": truncate_middle_bytes(content, budget * 4)[0]}
    if not isinstance(content, list):
        return item
    remaining = budget
    parts: list[Any] = []
    for part in content:
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str):
            parts.append(part)  # images and other non-text parts cost nothing here
            continue
        if remaining <= 0:
            continue
        cost = approx_tokens(text)
        if cost <= remaining:
            parts.append(part)
            remaining -= cost
        else:
            parts.append({**part, "text": truncate_middle_bytes(text, remaining * 4)[0]})
            remaining = 0
    return {**item, "content": parts}


def retained_user_messages(items: Sequence[Any], budget: int = RETAINED_MESSAGE_TOKEN_BUDGET) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    remaining = budget
    for item in reversed(items):
        if remaining <= 0:
            break
        if not is_real_user_message(item):
            continue
        cost = _cost(item)
        if cost <= remaining:
            kept.append(item)
            remaining -= cost
        else:
            kept.append(_truncate_message(item, remaining))
            remaining = 0
    kept.reverse()
    return kept
