"""Session identity: which task, agent and session a Responses request belongs to (pure)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from proxy.items.bridged import parse_mcp_id
from proxy.items.lazyitems import LazyItems, is_item_list

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
    first = (inp[0] if inp else None) if is_item_list(inp) else inp
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


FORK_SEP = "~"  # f:<start>~<first answer>: a conversation that shares its start with an older one
CLAIM_PREFIX = "fclaim:"  # alias keys: the start's first conversation (its value: that session)
CONTINUATION_PREFIX = "fcont:"
NEW_MARK = "n"  # f:<start>~n<fresh>: a first turn under a start an earlier conversation already claimed


def _model_item_key(item: Any) -> str | None:
    """A model-produced item in one spelling, as it is answered and as the agent resends it: an assistant
    message by its text, a call by its call id. Reasoning and other items are skipped (often dropped or
    re-encrypted by clients)."""
    if not isinstance(item, dict):
        return None
    if item.get("type", "message") == "message" and item.get("role") == "assistant":
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict)
                              and isinstance(p.get("text"), str))
        return "m:" + content if isinstance(content, str) and content else None
    typ, call_id = item.get("type"), item.get("call_id")
    if isinstance(typ, str) and typ.endswith("_call") and isinstance(call_id, str) and call_id:
        return "c:" + call_id
    if typ == "mcp_call" and (parsed := parse_mcp_id(item.get("id"))) is not None:
        return "c:" + parsed[1]  # a bridged call as the agent saw it: the model's call id is in its item id
    return None


def _walk(items: Any) -> Iterable[Any]:
    """The items of an input list to look through once; a lazy list's are built one at a time and not kept
    (an input without what is looked for is walked to its end: 100,000 items built and kept, LazyItems.scan)."""
    if isinstance(items, LazyItems):
        return items.scan()
    return items if is_item_list(items) else ()


def first_model_item(items: Any) -> str | None:
    """The key of the first model-produced item among `items`, if any."""
    for item in _walk(items):
        if (key := _model_item_key(item)) is not None:
            return key
    return None


def first_model_keys(items: Any) -> list[str]:
    """The keys an answer's next request may show first: the first call's and the first assistant message's
    (an agent that drops the calls it did not run, ctproxy's bridged `mcp_call`, resends the message first)."""
    call = message = None
    for item in _walk(items):
        if (key := _model_item_key(item)) is None:
            continue
        if key.startswith("m:"):
            message = message or key
        else:
            call = call or key
        if call and message:
            break
    return [k for k in (call, message) if k]


def continuation_alias(start_key: str, model_item: str) -> str:
    return CONTINUATION_PREFIX + _h(start_key, model_item)


def fingerprint_claim(session_key: str, source: str | None, output_items: Any,
                      claimed: Callable[[str], bool]) -> list[tuple[str, str]]:
    """The aliases (key, session) to record when a fingerprint session's answer arrives, so its next
    request finds it and an unrelated conversation with the same start does not: the first answer under
    a start claims it. Empty when the session is not a start, is already claimed, or the answer has no
    model item. `claimed(key)` says whether an alias key is known."""
    if source != "fingerprint" or not session_key.startswith("f:"):
        return []
    start, sep, rest = session_key.partition(FORK_SEP)
    if sep and not rest.startswith(NEW_MARK):
        return []  # a fork (told apart by its first answer): its requests carry that answer, nothing to claim
    keys = first_model_keys(output_items)
    claim = CLAIM_PREFIX + session_key
    if not keys or claimed(claim):
        return []
    # A second conversation under a start (`~n…`) takes its own continuation, not the start; a continuation
    # an earlier conversation already holds (the same first answer, word for word) stays with that one.
    conts = [continuation_alias(start, key) for key in keys]
    return [*((c, session_key) for c in conts if not (sep and claimed(c))), (claim, session_key)]


def _conversation_key(lower: Mapping[str, str], payload: Mapping[str, Any], agent: str | None,
                      response_aliases: Mapping[str, str] | None, fresh: str | None) -> tuple[str, str]:
    for name in ("session_id", "session-id", "conversation_id", "conversation-id", "thread-id"):
        if value := lower.get(name):
            return "c:" + _h(value, agent or ""), "codex"
    if isinstance(pck := payload.get("prompt_cache_key"), str) and pck:
        return "p:" + _h(pck, agent or ""), "prompt_cache_key"
    prev = payload.get("previous_response_id")
    if isinstance(prev, str) and response_aliases and prev in response_aliases:
        return response_aliases[prev], "previous_response"
    basis = orjson.dumps([payload.get("instructions"), _canonical_first(payload)], option=orjson.OPT_SORT_KEYS)
    start = "f:" + _h(basis.decode(), agent or "")
    inp = payload.get("input")
    model_item = first_model_item(inp) if is_item_list(inp) else None
    if model_item is None:
        # A first turn. Under a start an earlier conversation already claimed (it was answered), it is a
        # new conversation from its first request on (docs/history.md, "Whose conversation it is"): what
        # it writes before its second turn proves it new must stay in the task its later turns reach.
        if fresh and response_aliases is not None and CLAIM_PREFIX + start in response_aliases:
            return f"{start}{FORK_SEP}{NEW_MARK}{_h(fresh)[:16]}", "fingerprint"
        return start, "fingerprint"  # the same history so far is the same conversation
    # Past the first turn the model's first answer tells conversations apart: the one that answered first
    # under this start keeps it (its continuation alias, written by the journal); any other is its own.
    # A start nobody claimed yet (or journaled before claims existed) is this conversation's; without a
    # journal (no aliases) nothing tells conversations apart, and the start is kept as before.
    if response_aliases is None:
        return start, "fingerprint"
    cont, claim = continuation_alias(start, model_item), CLAIM_PREFIX + start
    lookup = getattr(response_aliases, "lookup", None)  # the journal's: both keys in one query (a shared store)
    if lookup is not None:
        got = lookup((cont, claim))
        found, claimed = got.get(cont), claim in got
    else:
        found = response_aliases.get(cont)
        claimed = found is None and claim in response_aliases
    if found is not None:
        return found, "fingerprint"
    if not claimed:
        return start, "fingerprint"
    return f"{start}{FORK_SEP}{_h(model_item)[:16]}", "fingerprint"


def minted_for(session_key: str, fresh: str) -> bool:
    """Whether `session_key` is the one `resolve_session(..., fresh=fresh)` mints for a first turn under a start
    an earlier conversation claimed (`f:<start>~n<fresh>`): a session that request opens, so nothing (no usage,
    no compaction record, no journal row) was recorded for it before, in any process."""
    return session_key.endswith(FORK_SEP + NEW_MARK + _h(fresh)[:16])


def resolve_session(headers: Mapping[str, str], payload: Mapping[str, Any] | None,
                    response_aliases: Mapping[str, str] | None = None, fresh: str | None = None) -> SessionIdentity:
    """Resolve the session key from, in order: x-ctp headers, Codex session headers,
    prompt_cache_key, previous_response_id (through known response→session aliases),
    else a fingerprint of instructions + the first input item. Past the first turn, a fingerprint
    session also needs the same first model answer: two conversations that share instructions and
    first message are one session only until they diverge (`fingerprint_claim`, issue 13 defect 5).

    `fresh`: a value unique to this request (the flow's id). With it, a first turn under a start an earlier
    conversation already claimed opens a session of its own (`f:<start>~n…`) whose answer claims its own
    continuation; without it (no journal, a pure lookup) such a turn joins the start as before.

    With `x-ctp-task`, the key still separates conversations: two agents of a task that send no
    `x-ctp-agent` are two sessions, not one."""
    lower = {k.lower(): v for k, v in headers.items()}
    task = lower.get(TASK_HEADER) or None
    agent = lower.get(AGENT_HEADER) or None
    payload = payload or {}
    model = payload.get("model") if isinstance(payload.get("model"), str) else None
    # (with x-ctp-task the journal keys the session by task and agent: a fresh start is never needed there)
    inner, source = _conversation_key(lower, payload, agent, response_aliases, None if task else fresh)
    if task:
        return SessionIdentity("t:" + _h(task, agent or "", inner), "header", task, agent, model)
    return SessionIdentity(inner, source, None, agent, model)


class _Aliases(Protocol):
    aliases: Mapping[str, str]

    def alias_response(self, response_id: str, session_key: str) -> None: ...


def record_fingerprint_claim(journal: _Aliases, session_key: str, source: str | None, items: Any,
                             opened: bool = False) -> None:
    """Called by the journal with a request's input and with its answer's output (see `fingerprint_claim`).
    `opened`: the items are the answer to the request that minted the session (`minted_for`): nothing claimed
    it before, in any process, so its claim is not looked up (a database read at the answer's terminal event,
    on the event loop, before the last bytes go on)."""
    known = journal.aliases.__contains__
    if opened:
        claim = CLAIM_PREFIX + session_key
        contains = known

        def known(key: str) -> bool:
            return key != claim and contains(key)

    for key, value in fingerprint_claim(session_key, source, items, known):
        journal.alias_response(key, value)
