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


def _canonical_first(payload: Mapping[str, Any]) -> Any:
    """The first input item in one spelling: `"hi"`, `[{"role":"user","content":"hi"}]` and
    `[{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}]` are one conversation."""
    inp = payload.get("input")
    first = (inp[0] if inp else None) if isinstance(inp, list) else inp
    if isinstance(first, str):
        return {"role": "user", "text": first}
    if isinstance(first, dict) and (first.get("type") in (None, "message")) and "role" in first:
        content = first.get("content")
        if isinstance(content, list):
            texts = [p.get("text") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            if len(texts) == len(content):
                content = "".join(texts)
        return {"role": first.get("role"), "text": content}
    return first


def _conversation_key(lower: Mapping[str, str], payload: Mapping[str, Any], agent: str | None,
                      response_aliases: Mapping[str, str] | None) -> tuple[str, str]:
    for name in ("session_id", "session-id", "conversation_id", "conversation-id", "thread-id"):
        if value := lower.get(name):
            return "c:" + _h(value, agent or ""), "codex"
    if isinstance(pck := payload.get("prompt_cache_key"), str) and pck:
        return "p:" + _h(pck, agent or ""), "prompt_cache_key"
    prev = payload.get("previous_response_id")
    if isinstance(prev, str) and response_aliases and prev in response_aliases:
        return response_aliases[prev], "previous_response"
    basis = orjson.dumps([payload.get("instructions"), _canonical_first(payload)], option=orjson.OPT_SORT_KEYS)
    return "f:" + _h(basis.decode(), agent or ""), "fingerprint"


def resolve_session(headers: Mapping[str, str], payload: Mapping[str, Any] | None,
                    response_aliases: Mapping[str, str] | None = None) -> SessionIdentity:
    """Resolve the session key from, in order: x-ctp headers, Codex session headers,
    prompt_cache_key, previous_response_id (through known response→session aliases),
    else a fingerprint of instructions + the first input item.

    With `x-ctp-task`, the key still separates conversations: two agents of a task that send no
    `x-ctp-agent` are two sessions, not one."""
    lower = {k.lower(): v for k, v in headers.items()}
    task = lower.get(TASK_HEADER) or None
    agent = lower.get(AGENT_HEADER) or None
    payload = payload or {}
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    inner, source = _conversation_key(lower, payload, agent, response_aliases)
    if task:
        return SessionIdentity("t:" + _h(task, agent or "", inner), "header", task, agent, model)
    return SessionIdentity(inner, source, None, agent, model)
