"""A rollover in the middle of a bridged turn (issue 13), its pure parts.

When the model calls `new_context` through the bridge and the bridge goes on with more rounds of the same
agent request, those rounds are forwarded in the new window: the stored bootstrap, then what the turn adds
after it. The window's boundary is in the agent's items as the agent will resend them: its request's
items, then the items of the merged answer shown so far (ctproxy's `mcp_call` items included).

An agent resends those shown items in its own form (the openai SDK drops null fields, `model_dump(
exclude_none=True)`; a raw client keeps them), so the one-chain hash of the boundary may not match the
resend even though it is the same conversation. The window keeps an anchor for that case: the id of the
last shown item (an `mcp_call` id ctproxy made, unique to the call). A resend whose positional check fails
but that holds the anchor has its boundary right after it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.journal.canonical import chain_at
from proxy.transforms.window import WindowProjection

ANCHOR_KEY = "anchor"  # in a notes window's bootstrap JSON, beside "items"


def anchor_of(shown: Sequence[Mapping[str, Any]]) -> str | None:
    """The id of the last item shown to the agent so far (the boundary's last item), when it has one."""
    if not shown:
        return None
    iid = shown[-1].get("id")
    return iid if isinstance(iid, str) and iid else None


def reanchored(items: Sequence[Any], proj: WindowProjection, anchor: str | None) -> WindowProjection | None:
    """`proj` with its boundary right after the agent's item whose id is `anchor` (the newest such item),
    checked for these very items (the caller applies it with `checked=True`); None when there is none.
    Called only when the positional check failed: the same position in another form, or another one."""
    if not anchor:
        return None
    for k in range(len(items) - 1, -1, -1):
        item = items[k]
        if isinstance(item, dict) and item.get("id") == anchor:
            return dataclasses.replace(proj, boundary=k + 1, boundary_hash=chain_at(items, proj.root, k + 1) or "")
    return None


def in_new_window(payload: Mapping[str, Any], bootstrap: Sequence[Any]) -> dict[str, Any]:
    """The bridge's next round in the new window: the stored bootstrap is its whole input so far (the
    boundary is after everything the turn did up to the rollover); everything else kept. Stateless from
    here on: the upstream's stored response is the old window's."""
    out = {k: v for k, v in payload.items() if k != "previous_response_id"}
    out["input"] = list(bootstrap)
    return out
