"""The compaction projection (DESIGN §3.3, seed 004 §5.2): replace the client's items before a
compacted boundary by the checkpoint's bootstrap.

Remote bootstrap (fingerprint compatible): retained real user messages → the one opaque compaction
item. Readable bootstrap (anything else): the fallback message (marker + transcript excerpt). The
client's items after the boundary follow unchanged. The boundary is checked against the hash chain
of the client's items: when the client's history no longer starts with the compacted items, nothing
is replaced (`diverged`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.transforms.fallback import fallback_message, is_fallback_message, shrink_fallback_text
from proxy.transforms.items import COMPACTION_ITEM_TYPES, input_items, items_bytes, prefix_hash, text_parts

Outcome = Literal["remote", "fallback", "diverged", "already", "not_applicable"]


@dataclass(frozen=True)
class CompactionRecord:
    """What a checkpoint contributes to a projection (the stored dual representation)."""

    checkpoint_id: str
    boundary: int  # how many of the client's items the checkpoint covers
    boundary_hash: str  # chain hash of those items (proxy.transforms.items.chain_hashes)
    retained: tuple[dict[str, Any], ...]  # retained real user messages, chronological
    compaction_item: dict[str, Any] | None  # the opaque item; None for a fallback-only checkpoint
    fallback_text: str  # marker + excerpt

    def bootstrap(self, replay_opaque: bool) -> list[dict[str, Any]]:
        if replay_opaque and self.compaction_item is not None:
            return [*self.retained, self.compaction_item]
        return [fallback_message(self.fallback_text)]


@dataclass(frozen=True)
class ProjectionContext:
    record: CompactionRecord
    replay_opaque: bool  # model, endpoint, account hash and auth kind match and the feature is on


def boundary_matches(items: Sequence[Any], record: CompactionRecord) -> bool:
    return prefix_hash(items, record.boundary) == record.boundary_hash


def apply_projection(payload: dict[str, Any], ctx: ProjectionContext) -> tuple[dict[str, Any], Outcome]:
    """The projected payload (or `payload` itself) and what happened."""
    items = input_items(payload)
    if items is None:
        return payload, "not_applicable"
    record = ctx.record
    bootstrap = record.bootstrap(ctx.replay_opaque)
    if _starts_with_bootstrap(items, record):
        return payload, "already"
    if not boundary_matches(items, record):
        return payload, "diverged"
    new = dict(payload)
    new["input"] = [*bootstrap, *items[record.boundary:]]
    return new, "remote" if bootstrap and bootstrap[-1] is record.compaction_item else "fallback"


def fit_input(bootstrap: Sequence[Any], tail: Sequence[Any], budget_bytes: int) -> list[Any] | None:
    """`bootstrap + tail` serialized within `budget_bytes`, or None when that is impossible.

    What gives way, in order: the bootstrap's retained messages, oldest first (the compaction item
    stays), then the fallback's excerpt (its marker stays). The tail (the agent's items after the
    boundary) is never touched.
    """
    boot = list(bootstrap)
    rest = list(tail)

    def size() -> int:
        return items_bytes([*boot, *rest])

    while size() > budget_bytes:
        idx = next((i for i, it in enumerate(boot) if not _anchor(it)), None)
        if idx is None:
            break
        del boot[idx]
    for i, it in enumerate(boot):
        excess = size() - budget_bytes
        if excess <= 0:
            break
        if is_fallback_message(it):
            text = "".join(text_parts(it))
            boot[i] = fallback_message(shrink_fallback_text(text, len(text.encode()) - excess))
    return [*boot, *rest] if size() <= budget_bytes else None


def _anchor(item: Any) -> bool:
    """What a bootstrap cannot do without: the compaction item, the fallback message."""
    typ = item.get("type") if isinstance(item, dict) else None
    return typ in COMPACTION_ITEM_TYPES or is_fallback_message(item)


def project(payload: dict[str, Any], ctx: ProjectionContext) -> dict[str, Any]:
    """The transform form: `(payload, ctx) -> payload`."""
    return apply_projection(payload, ctx)[0]


def _starts_with_bootstrap(items: Sequence[Any], record: CompactionRecord) -> bool:
    for replay in (True, False):
        boot = record.bootstrap(replay)
        if boot and len(items) >= len(boot) and list(items[: len(boot)]) == boot:
            return True
    return False
