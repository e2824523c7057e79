"""A rollover in the middle of a bridged turn (issue 13), its pure parts.

When the model calls `new_context` through the bridge and the bridge goes on with more rounds of the same
agent request, those rounds are forwarded in the new window: the stored bootstrap, then what the turn adds
after it. The window's boundary is in the agent's items as the agent will resend them: its request's
items, then the items of the merged answer shown so far (ctproxy's `mcp_call` items included).

An agent resends those shown items in its own form (the openai SDK drops null fields, `model_dump(
exclude_none=True)`; a raw client keeps them), so the one-chain hash of the boundary may not match the
resend even though it is the same conversation. The window keeps anchors for that case: the ids of the
shown items, newest first (the last is an `mcp_call` id ctproxy made, unique to the call). A resend whose
positional check fails has its boundary right after the newest anchor it holds. An agent may also drop
items it does not model (Codex resends no `mcp_call`): when it holds none of the anchors, the boundary is
right after the agent's own request items, if the resend starts with exactly those (by the one hash chain).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.items.canonical import chain_at
from proxy.windows.apply import WindowProjection

ANCHOR_KEY = "anchor"  # in a notes window's bootstrap JSON, beside "items": the newest anchor (older windows)
ANCHORS_KEY = "anchors"  # the shown items' ids, newest first
PREFIX_KEY = "agent_prefix"  # [n, hash]: the agent's own request items, as the one hash chain ends after them
MAX_ANCHORS = 16


def anchor_of(shown: Sequence[Mapping[str, Any]]) -> str | None:
    """The id of the last item shown to the agent so far (the boundary's last item), when it has one."""
    anchors = anchors_of(shown)
    return anchors[0] if anchors and shown and shown[-1].get("id") == anchors[0] else None


def anchors_of(shown: Sequence[Mapping[str, Any]]) -> list[str]:
    """The ids of the items shown to the agent so far, newest first (at most `MAX_ANCHORS`)."""
    out: list[str] = []
    for item in reversed(shown):
        iid = item.get("id")
        if isinstance(iid, str) and iid:
            out.append(iid)
            if len(out) == MAX_ANCHORS:
                break
    return out


def reanchored(items: Sequence[Any], proj: WindowProjection, anchors: str | Sequence[str] | None,
               agent_prefix: Sequence[Any] | None = None) -> WindowProjection | None:
    """`proj` with its boundary right after the newest anchor the agent's items hold (the newest such item),
    else right after the agent's own request items when the resend starts with them (`agent_prefix`: their
    count and the hash chain's id there); checked for these very items (the caller applies it with
    `checked=True`). None when neither is found. Called only when the positional check failed."""
    wanted = [anchors] if isinstance(anchors, str) else list(anchors or ())
    for anchor in wanted:
        for k in range(len(items) - 1, -1, -1):
            item = items[k]
            if isinstance(item, dict) and item.get("id") == anchor:
                return dataclasses.replace(proj, boundary=k + 1,
                                           boundary_hash=chain_at(items, proj.root, k + 1) or "")
    if agent_prefix is not None and len(agent_prefix) == 2:
        n, want = agent_prefix
        if (isinstance(n, int) and 0 < n <= len(items) and isinstance(want, str) and want
                and chain_at(items, proj.root, n) == want):
            return dataclasses.replace(proj, boundary=n, boundary_hash=want)
    return None


def in_new_window(payload: Mapping[str, Any], bootstrap: Sequence[Any]) -> dict[str, Any]:
    """The bridge's next round in the new window: the stored bootstrap is its whole input so far (the
    boundary is after everything the turn did up to the rollover); everything else kept. Stateless from
    here on: the upstream's stored response is the old window's."""
    out = {k: v for k, v in payload.items() if k != "previous_response_id"}
    out["input"] = list(bootstrap)
    return out
