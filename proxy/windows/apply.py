"""The context projection (DESIGN §3.3, ADR 0006): a session's current window applied to a request.

A window names a boundary in the agent's own items (how many, and the one-chain id of the last one,
proxy/items/canonical.chain_at under the session's root) and a bootstrap: the items the model sees
instead of those before the boundary. Applying it is `bootstrap + items[boundary:]`, when the agent's
items still start with what the window covers; when they do not (the history was edited or branched)
nothing is replaced (`diverged`) and the caller says so in the journal. A request that already starts
with one of the window's bootstraps (the agent resent what it was given) is left alone (`already`).

Every strategy (remote, fallback, notes, …) reduces to a `WindowProjection`; this module knows none of
them. Pure: dicts in, dicts out, unknown fields kept, idempotent (a verified boundary is remembered
by the fingerprint of its prefix's bytes: a cache of facts, never a different answer).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.items.canonical import LEGACY_PREFIX, chain_at, fingerprint, legacy_chain_hash
from proxy.items.inputs import ADDITIONAL_TOOLS, input_items

Outcome = Literal["applied", "already", "diverged", "not_applicable"]


@dataclass(frozen=True)
class WindowProjection:
    window_id: str
    boundary: int  # agent items the bootstrap replaces
    boundary_hash: str  # one-chain id of item boundary-1 (or a migrated `v1:` hash)
    root: str  # the chain's root: proxy.items.canonical.session_root(session key)
    bootstrap: tuple[Any, ...]  # what the model sees instead of items[:boundary]
    # Other bootstraps of the same window that a request may already start with (e.g. the readable form
    # of a remote window): such a request is not projected twice.
    alternatives: tuple[tuple[Any, ...], ...] = ()
    # The agent's own leading instructions (system/developer messages) the window kept as they were: the first
    # `lead` items of every bootstrap are a copy of the agent's first `lead` items at the rollover. When the agent
    # changes them later (Pi's date line at midnight, a new tool list), the window still applies: its boundary is
    # also anchored on the conversation alone (`conversation_hash`: the one chain over items[lead:boundary]), and
    # the request's own instructions take the copy's place (seed 000: the instructions are the agent's).
    lead: int = 0
    conversation_hash: str = ""


# Boundaries this process verified, with the fingerprint of the prefix's bytes then: an agent resends the
# same prefix every turn, and one serialization (≈0.4 ms for 750 kB) is much cheaper than canonicalising and
# hashing every item again (≈14 ms); the journal's resend fast path uses the same fingerprint. A cache of
# facts: the answer is the same with or without it.
VERIFIED_BOUNDARIES = 1024
_verified: OrderedDict[tuple[str, str, int], int] = OrderedDict()


def boundary_matches(items: Sequence[Any], proj: WindowProjection) -> bool:
    """The agent's first `boundary` items are the ones the window covers (the one chain)."""
    if proj.boundary_hash.startswith(LEGACY_PREFIX):
        return legacy_chain_hash(items, proj.boundary) == proj.boundary_hash
    if proj.boundary <= 0 or proj.boundary > len(items):
        return False
    key = (proj.root, proj.boundary_hash, proj.boundary)
    fp = fingerprint(orjson.dumps(list(items[: proj.boundary])))
    if _verified.get(key) == fp:
        return True
    if chain_at(items, proj.root, proj.boundary) != proj.boundary_hash:
        return False
    _verified[key] = fp
    _verified.move_to_end(key)
    while len(_verified) > VERIFIED_BOUNDARIES:
        _verified.popitem(last=False)
    return True


def is_instruction(item: Any) -> bool:
    """A system/developer message, or Codex's leading `additional_tools` item: what leads an agent's input."""
    if not isinstance(item, dict):
        return False
    if item.get("type") == ADDITIONAL_TOOLS:
        return True
    return item.get("type", "message") == "message" and item.get("role") in ("system", "developer")


def instruction_run(items: Sequence[Any], limit: int | None = None) -> int:
    """How many of `items` (at most `limit`) lead them as instructions."""
    n, end = 0, len(items) if limit is None else min(limit, len(items))
    while n < end and is_instruction(items[n]):
        n += 1
    return n


def conversation_hash(items: Sequence[Any], root: str, lead: int, boundary: int) -> str:
    """The one chain over the conversation up to the boundary, without the agent's `lead` instructions."""
    if not 0 <= lead < boundary <= len(items):
        return ""
    return chain_at(list(items[lead:boundary]), root, boundary - lead) or ""


def revised_instructions(items: Sequence[Any], proj: WindowProjection) -> bool:
    """The agent's items hold the window's conversation after as many instructions as the window kept, but
    those instructions changed (not the conversation: that would be an edit, `diverged`)."""
    lead = proj.lead
    if lead <= 0 or not proj.conversation_hash or proj.boundary <= lead or proj.boundary > len(items):
        return False
    if instruction_run(items, lead + 1) != lead:
        return False
    return conversation_hash(items, proj.root, lead, proj.boundary) == proj.conversation_hash


def starts_with_bootstrap(items: Sequence[Any], proj: WindowProjection) -> bool:
    for boot in (proj.bootstrap, *proj.alternatives):
        if boot and len(items) >= len(boot) and list(items[: len(boot)]) == list(boot):
            return True
    return False


def apply_window(payload: dict[str, Any], proj: WindowProjection,
                 checked: bool = False) -> tuple[dict[str, Any], Outcome]:
    """The projected payload (or `payload` itself) and what happened. `checked`: the caller has verified
    the boundary for these very items already (the hash is not computed twice for one request)."""
    items = input_items(payload)
    if items is None:
        return payload, "not_applicable"
    if starts_with_bootstrap(items, proj):
        return payload, "already"
    new = dict(payload)
    if checked or boundary_matches(items, proj):
        new["input"] = [*proj.bootstrap, *items[proj.boundary:]]
    elif revised_instructions(items, proj):  # the agent's new instructions replace the copy, the window holds
        # (copies, as the stored ones are: a bootstrap item is never the agent's object, so it gets no [id: …])
        revised = orjson.loads(orjson.dumps(list(items[:proj.lead])))
        new["input"] = [*revised, *proj.bootstrap[proj.lead:], *items[proj.boundary:]]
    else:
        return payload, "diverged"
    return new, "applied"
