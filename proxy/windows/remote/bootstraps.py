"""The compaction strategies' bootstraps (DESIGN §3.3, seed 004 §5.2), on the one window projection
(proxy/windows/apply.py).

Remote bootstrap (fingerprint compatible): retained real user messages → the one opaque compaction
item. Readable bootstrap (anything else): the fallback message (marker + transcript excerpt). The
client's items after the boundary follow unchanged. The boundary is checked against the one hash
chain of the client's items: when the client's history no longer starts with the compacted items,
nothing is replaced (`diverged`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from proxy.items.inputs import COMPACTION_ITEM_TYPES, text_parts
from proxy.windows.apply import WindowProjection, apply_window
from proxy.windows.apply import boundary_matches as _window_boundary_matches
from proxy.windows.fallback import fallback_message, is_fallback_message, shrink_fallback_text

Outcome = Literal["remote", "fallback", "diverged", "already", "not_applicable"]


@dataclass(frozen=True)
class CompactionRecord:
    """What a checkpoint (a remote/fallback window) contributes to a projection."""

    checkpoint_id: str
    boundary: int  # how many of the client's items the checkpoint covers
    boundary_hash: str  # one-chain id of the boundary item (proxy.items.canonical.chain_at from `root`)
    retained: tuple[dict[str, Any], ...]  # retained real user messages, chronological
    compaction_item: dict[str, Any] | None  # the opaque item; None for a fallback-only checkpoint
    fallback_text: str  # marker + excerpt
    root: str = ""  # the chain's root: the journal session's root (session_root(key))
    # the window's notes parts, where the context capability opened or manages it (the one builder,
    # proxy/windows/notes/bootstrap.py `window_notes`): identity and notes index before, continuation after
    preface: tuple[dict[str, Any], ...] = ()
    coda: tuple[dict[str, Any], ...] = ()
    # the agent's own leading system/developer messages, kept whole in their roles before everything else
    # (defect 2 of seed000-defects.md: never demoted into the excerpt), and the boundary's chain over the
    # conversation alone (proxy/windows/apply.py `conversation_hash`)
    leading: tuple[dict[str, Any], ...] = ()
    conversation_hash: str = ""

    def bootstrap(self, replay_opaque: bool) -> list[dict[str, Any]]:
        if replay_opaque and self.compaction_item is not None:
            return [*self.leading, *self.preface, *self.retained, self.compaction_item, *self.coda]
        return [*self.leading, *self.preface, fallback_message(self.fallback_text), *self.coda]

    def projection(self, replay_opaque: bool) -> WindowProjection:
        boot = tuple(self.bootstrap(replay_opaque))
        other = tuple(self.bootstrap(not replay_opaque))
        return WindowProjection(self.checkpoint_id, self.boundary, self.boundary_hash, self.root, boot,
                                (other,) if other != boot else (), len(self.leading), self.conversation_hash)


@dataclass(frozen=True)
class ProjectionContext:
    record: CompactionRecord
    replay_opaque: bool  # model, endpoint, account hash and auth kind match and the feature is on


def boundary_matches(items: Sequence[Any], record: CompactionRecord) -> bool:
    return _window_boundary_matches(items, record.projection(False))


def apply_projection(payload: dict[str, Any], ctx: ProjectionContext,
                     checked: bool = False) -> tuple[dict[str, Any], Outcome]:
    """The projected payload (or `payload` itself) and what happened."""
    record = ctx.record
    proj = record.projection(ctx.replay_opaque)
    out, outcome = apply_window(payload, proj, checked)
    if outcome != "applied":
        return out, outcome
    return out, "remote" if ctx.replay_opaque and record.compaction_item is not None else "fallback"


def fit_projection(projected: dict[str, Any], tail: Sequence[Any], budget_bytes: int) -> dict[str, Any] | None:
    """A projected payload whose input ends with `tail` (the agent's items after the boundary), with its
    bootstrap trimmed (fit_input) so the input is within `budget_bytes`; None when it cannot be."""
    items = projected.get("input")
    if not isinstance(items, list):
        return None
    boot_len = len(items) - len(tail)
    if boot_len < 0 or items[boot_len:] != list(tail):
        return None  # not a projection with this tail
    fitted = fit_input(items[:boot_len], tail, budget_bytes)
    return None if fitted is None else {**projected, "input": fitted}


def fit_input(bootstrap: Sequence[Any], tail: Sequence[Any], budget_bytes: int) -> list[Any] | None:
    """`bootstrap + tail` serialized within `budget_bytes`, or None when that is impossible.

    What gives way, in order: the bootstrap's retained messages, oldest first (the compaction item
    stays), then the fallback's excerpt (its marker stays). The tail (the agent's items after the
    boundary) is never touched.
    """
    boot = list(bootstrap)
    rest = list(tail)
    # Each item serialized once (the tail never changes): re-serializing the whole input for every
    # dropped message made a session above its threshold pay O(messages × input) on every request.
    sizes = [_item_bytes(it) for it in boot]
    rest_bytes = sum(_item_bytes(it) for it in rest)

    def size() -> int:  # == items_bytes([*boot, *rest]): brackets, the items, one comma between two
        n = len(boot) + len(rest)
        return 2 + sum(sizes) + rest_bytes + max(0, n - 1)

    while size() > budget_bytes:
        idx = next((i for i, it in enumerate(boot) if not _anchor(it)), None)
        if idx is None:
            break
        del boot[idx], sizes[idx]
    for i, it in enumerate(boot):
        excess = size() - budget_bytes
        if excess <= 0:
            break
        if is_fallback_message(it):
            text = "".join(text_parts(it))
            boot[i] = fallback_message(shrink_fallback_text(text, len(text.encode()) - excess))
            sizes[i] = _item_bytes(boot[i])
    return [*boot, *rest] if size() <= budget_bytes else None


def _item_bytes(item: Any) -> int:
    return len(orjson.dumps(item))


def _anchor(item: Any) -> bool:
    """What a bootstrap cannot do without: the compaction item, the fallback message, and the window's notes
    parts (developer messages: identity, notes index, continuation; small, and the model's way back), and the
    agent's own instructions (system/developer)."""
    if not isinstance(item, dict):
        return False
    return (item.get("type") in COMPACTION_ITEM_TYPES or item.get("role") in ("developer", "system")
            or is_fallback_message(item))


def project(payload: dict[str, Any], ctx: ProjectionContext) -> dict[str, Any]:
    """The transform form: `(payload, ctx) -> payload`."""
    return apply_projection(payload, ctx)[0]
