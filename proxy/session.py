"""Session identity: which task, agent and session a Responses request belongs to (pure)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

TASK_HEADER = "x-ctp-task"
AGENT_HEADER = "x-ctp-agent"


@dataclass(frozen=True)
class SessionIdentity:
    session_key: str  # stable key of the conversation
    source: str  # which signal gave the key: header | codex | prompt_cache_key | previous_response | fingerprint
    task: str | None  # x-ctp-task as sent (validated by the journal), else None
    agent: str | None  # x-ctp-agent as sent, else None
    model: str | None = None


def _h(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()[:24]


def _first_item(payload: Mapping[str, Any]) -> Any:
    inp = payload.get("input")
    if isinstance(inp, list):
        return inp[0] if inp else None
    return inp


def resolve_session(headers: Mapping[str, str], payload: Mapping[str, Any] | None,
                    response_aliases: Mapping[str, str] | None = None) -> SessionIdentity:
    """Resolve the session key from, in order: x-ctp headers, Codex session headers,
    prompt_cache_key, previous_response_id (through known response→session aliases),
    else a fingerprint of instructions + the first input item."""
    lower = {k.lower(): v for k, v in headers.items()}
    task = lower.get(TASK_HEADER) or None
    agent = lower.get(AGENT_HEADER) or None
    payload = payload or {}
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    if task:
        return SessionIdentity("t:" + _h(task, agent or "/root"), "header", task, agent, model)
    for name in ("session_id", "session-id", "conversation_id", "conversation-id", "thread-id"):
        if value := lower.get(name):
            return SessionIdentity("c:" + _h(value, agent or ""), "codex", None, agent, model)
    if isinstance(pck := payload.get("prompt_cache_key"), str) and pck:
        return SessionIdentity("p:" + _h(pck, agent or ""), "prompt_cache_key", None, agent, model)
    prev = payload.get("previous_response_id")
    if isinstance(prev, str) and response_aliases and prev in response_aliases:
        return SessionIdentity(response_aliases[prev], "previous_response", None, agent, model)
    instructions = payload.get("instructions")
    first = _first_item(payload)
    basis = orjson.dumps([instructions, first], option=orjson.OPT_SORT_KEYS).decode()
    return SessionIdentity("f:" + _h(basis, agent or ""), "fingerprint", None, agent, model)
