"""When to compact and when to hold a stream: the proxy's token estimate (pure).

The estimate follows Codex (codex-protocol.md §1.2): the last reported usage plus the new items'
size at 4 bytes per token. The byte ratio is calibrated per session: the last usage's input tokens
divided by the byte estimate of what was sent then. When there is no usable usage (first request,
or the projection changed since), the whole projected input is estimated from its bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.items.inputs import approx_tokens_for_bytes, items_bytes
from proxy.windows.remote.retained import is_real_user_message

HOLD_FRACTION = 0.9  # above this share of the window a stream is held until its first output event
TAIL_FRACTION = 0.25  # the kept tail after a boundary may use at most this share of the window
_RATIO_BOUNDS = (0.25, 4.0)


@dataclass(frozen=True)
class UsageSnapshot:
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class LastRequest:
    """What was forwarded last time in this session."""

    checkpoint_id: str | None
    client_items: int
    sent_bytes: int


@dataclass(frozen=True)
class Estimate:
    tokens: int
    method: str  # usage | bytes
    ratio: float


def calibration(usage: UsageSnapshot | None, last: LastRequest | None) -> float:
    if usage is None or last is None or last.sent_bytes <= 0 or usage.input_tokens <= 0:
        return 1.0
    ratio = usage.input_tokens / approx_tokens_for_bytes(last.sent_bytes)
    return min(max(ratio, _RATIO_BOUNDS[0]), _RATIO_BOUNDS[1])


def estimate(projected_bytes: int, client_items: Sequence[Any], checkpoint_id: str | None,
             usage: UsageSnapshot | None, last: LastRequest | None) -> Estimate:
    ratio = calibration(usage, last)
    if (
        usage is not None
        and last is not None
        and last.checkpoint_id == checkpoint_id
        and last.client_items <= len(client_items)
    ):
        new_bytes = items_bytes(client_items[last.client_items:])
        tokens = usage.input_tokens + usage.output_tokens + math.ceil(approx_tokens_for_bytes(new_bytes) * ratio)
        return Estimate(tokens, "usage", ratio)
    return Estimate(math.ceil(approx_tokens_for_bytes(projected_bytes) * ratio), "bytes", ratio)


def over(tokens: int, window: int | None, fraction: float) -> bool:
    return window is not None and window > 0 and tokens > fraction * window


def choose_boundary(client_items: Sequence[Any], previous_boundary: int, window: int) -> int:
    """Where a new compaction ends. Like Codex's pre-turn compaction, the newest real user message and
    what follows it stay verbatim after the compaction item when that tail is small; otherwise the
    compaction covers everything (mid-turn layout)."""
    n = len(client_items)
    for k in range(n - 1, previous_boundary, -1):
        if is_real_user_message(client_items[k]):
            tail_tokens = approx_tokens_for_bytes(items_bytes(client_items[k:]))
            if k > 0 and tail_tokens <= TAIL_FRACTION * window:
                return k
            break
    return n


def status(enabled: bool, threshold: float, recover_overflow: bool, upstream_official: bool,
           upstream_trusted: bool) -> tuple[str, str]:
    """(`active`|`unavailable`|`off`, reason) for `ctproxy status`. Structural only: no credential
    is refreshed and no account is claimed to be verified."""
    if not enabled:
        if recover_overflow:
            return "off", "remote_compaction.enabled is false; overflow recovery uses the readable fallback"
        return "off", ("remote_compaction.enabled is false; overflow recovery is off (context and remote_compaction "
                       "off, or remote_compaction.recover_overflow false): context_length_exceeded reaches the agent "
                       "unchanged")
    if not (upstream_official or upstream_trusted):
        return "unavailable", "needs an official route (api.openai.com/v1 or chatgpt.com/backend-api/codex)"
    return "active", f"compacts above {threshold:.0%} of the model window; replay needs matching fingerprints"
