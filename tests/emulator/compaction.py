"""`POST /v1/responses/compact`: retained user messages + exactly one opaque compaction item.

Pure. The retention rule mirrors Codex's description of the server default
(codex-protocol.md §1.4): real user messages, newest first, within 64,000 approximate tokens;
the newest is always kept; older ones that do not fit are dropped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .wire import approx_tokens, canonical_hash, make_usage, merge_usage, new_id, opaque_blob, request_input

RETAINED_MESSAGE_TOKEN_BUDGET = 64_000


def _user_message(item: Any) -> dict[str, Any] | None:
    """The item as an output `Message` if it is a user message, else None."""
    if not isinstance(item, dict) or item.get("role") != "user" or item.get("type", "message") != "message":
        return None
    content = item.get("content")
    if isinstance(content, str):
        parts = [{"type": "input_text", "text": content}]
    elif isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
    else:
        return None
    return {"id": new_id("msg"), "type": "message", "status": "completed", "role": "user", "content": parts}


def _cost(message: Mapping[str, Any]) -> int:
    texts = [p.get("text", "") for p in message["content"] if p.get("type") == "input_text"]
    return max(1, sum(approx_tokens(t) for t in texts if isinstance(t, str)))


def retained_user_messages(items: list[Any], budget: int = RETAINED_MESSAGE_TOKEN_BUDGET) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    remaining = budget
    for item in reversed(items):
        msg = _user_message(item)
        if msg is None:
            continue
        cost = _cost(msg)
        if kept and cost > remaining:
            break
        kept.append(msg)
        remaining -= cost
    kept.reverse()
    return kept


def compaction_blob(history_digest: bytes) -> str:
    """Deterministic per input: the same history always compacts to the same opaque blob."""
    return opaque_blob(b"compaction" + history_digest, 512)


def compaction_content(items: list[Any]) -> str:
    return compaction_blob(canonical_hash(items))


def compact_resource(
    body: Mapping[str, Any],
    input_tokens: int,
    *,
    encrypted_content: str | None = None,
    usage: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A `CompactResource` for a `CompactResponseMethodPublicBody` request."""
    items = request_input(body)
    blob = encrypted_content if encrypted_content is not None else compaction_content(items)
    output = [*retained_user_messages(items), {"id": new_id("cmp"), "type": "compaction", "encrypted_content": blob}]
    return {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": output,
        "usage": merge_usage(make_usage(input_tokens, approx_tokens(blob)), usage),
    }
