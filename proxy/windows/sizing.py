"""Compaction's threshold and overflow retry sizing, pure (issue 29: moved out of addons/compaction.py).

What a request weighs (`payload_bytes`, `tokens`, `estimate_of`), whether the threshold compacts it
(`wants_compaction`: fresh items, over the threshold, grown since the last compaction, or a compaction forced
by an overflow that streamed), how far the bootstrap gives way (`fit`), and the one decision record the
other stages read (`decided`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from proxy import usage
from proxy.items.inputs import approx_tokens_for_bytes, items_bytes
from proxy.windows.decision import WindowDecision
from proxy.windows.remote import store
from proxy.windows.remote.bootstraps import fit_projection
from proxy.windows.remote.decision import TAIL_FRACTION, Estimate, LastRequest, UsageSnapshot, estimate, over
from proxy.windows.remote.flowinfo import FlowInfo

# An overflow retry sends at most this share of the body that failed: the upstream's real window is
# somewhere below the failed size, and one retry should not have to guess twice.
RETRY_FRACTION = 0.5


def payload_bytes(payload: dict[str, Any], items: list[Any]) -> int:
    """What the estimate counts: input, instructions and tools, serialized."""
    tools = payload.get("tools") if isinstance(payload.get("tools"), list) else []
    return len(str(payload.get("instructions") or "").encode()) + items_bytes(tools) + items_bytes(items)


def tokens(n_bytes: int, ratio: float) -> int:
    return math.ceil(approx_tokens_for_bytes(n_bytes) * ratio)


def fresh(info: FlowInfo) -> bool:
    """New agent items since the session's last compaction (or no compaction in effect)."""
    done = info.compacted_items
    return done is None or info.checkpoint is None or len(info.client_items) > done


def grown(info: FlowInfo) -> bool:
    """A threshold compaction right after another one helps only when the agent's items since then weigh
    something (at least the tail's share of the window): otherwise the new bootstrap is about the old
    one, and the session would compact on every request (openai/codex#40213, #26783)."""
    done = info.compacted_items
    if done is None or info.checkpoint is None or not info.window:
        return True
    added = approx_tokens_for_bytes(items_bytes(info.client_items[done:])) * info.estimate.ratio
    return added >= TAIL_FRACTION * info.window


def wants_compaction(info: FlowInfo, sess: store.SessionRecord | None, n_items: int, enabled: bool,
                     threshold: float, recover: bool) -> bool:
    """The threshold (remote_compaction's own) or a compaction forced by an overflow that had streamed: on an
    official route, with a known window, never twice at the same items, only with new items since the last."""
    failed_here = sess is not None and sess.failed_items == n_items
    return info.route.eligible and info.window is not None and not failed_here and fresh(info) and (
        (enabled and over(info.estimate.tokens, info.window, threshold) and grown(info))
        or (sess is not None and sess.force_compact and recover))


def estimate_of(sent_bytes: int, info: FlowInfo, sess: store.SessionRecord | None,
                last_usage: usage.Usage | None) -> Estimate:
    """The one estimate of the request (docs/context.md): calibrated on the last usage where it applies."""
    snap = UsageSnapshot(last_usage.input_tokens, last_usage.output_tokens) if last_usage else None
    last: LastRequest | None = sess.last if sess is not None else None
    cp_id = info.checkpoint.id if info.checkpoint else None
    return estimate(sent_bytes, info.client_items, cp_id, snap, last)


def fit(payload: dict[str, Any], info: FlowInfo, budget_tokens: float,
        added: Sequence[Any] = ()) -> tuple[dict[str, Any], int] | None:
    """The projected payload with its bootstrap trimmed so the whole estimate is within `budget_tokens`, and
    the input-bytes budget that took; None when even the bare compaction item (or marker) and the tail do not
    fit. `added`: items after the agent's (a bridged turn's executed calls), part of the tail."""
    cp = info.checkpoint
    if cp is None or info.outcome == "already":
        return None  # "already": the client sent the bootstrap itself; its own items are not ours to cut
    budget_bytes = int(budget_tokens / max(info.estimate.ratio, 0.01) * 4) - payload_bytes(payload, [])
    fitted = fit_projection(payload, [*info.client_items[cp.boundary:], *added], budget_bytes)
    return None if fitted is None else (fitted, budget_bytes)


def decided(info: FlowInfo, boundary_checked: bool, fit_budget: int | None = None) -> WindowDecision:
    """The request's window decision, as compaction's record now holds it."""
    return WindowDecision(checkpoint=info.checkpoint, replay_opaque=info.replay_opaque, outcome=info.outcome,
                          compacted=info.compacted, compacted_items=info.compacted_items,
                          boundary_checked=boundary_checked, fit_budget=fit_budget,
                          client_items=info.client_items, window=info.window, estimate=info.estimate)
