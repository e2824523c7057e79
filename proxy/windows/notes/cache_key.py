"""A stable `prompt_cache_key` for a session whose client sends none (issue 47, docs/prompt-cache.md).

The upstream buckets its prompt cache by this key (without one: by the prompt's leading tokens, shared by every
session that starts with the same tools and instructions, which then compete for the same cache machines). A
client that sets its own key (Codex: the conversation id; Pi) is left alone. The derived key is a digest of
ctproxy's session key: the same for every request of the session, never the session's identity itself, and
within the API's 64 characters."""

from __future__ import annotations

import hashlib
from typing import Any

PREFIX = "ctp-"


def derived(session_key: str) -> str:
    return PREFIX + hashlib.sha256(b"ctproxy prompt_cache_key\x00" + session_key.encode("utf-8")).hexdigest()[:32]


def with_key(payload: dict[str, Any], session_key: str | None) -> dict[str, Any]:
    """`payload` with a derived key when it has none (the same object otherwise)."""
    if session_key is None or payload.get("prompt_cache_key") is not None:
        return payload
    return {**payload, "prompt_cache_key": derived(session_key)}
