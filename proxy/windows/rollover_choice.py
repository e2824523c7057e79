"""Which road a rollover takes (seed 000, issue 13, ADR 0006; issue 29: moved out of addons/context.py), pure.

A rollover's kind is `new_context` (the model asked), `checkpoint` (a manual checkpoint) or `threshold` (the
hard trigger). Under strategy `notes` a checkpoint or the trigger runs the checkpoint turn first; under
`remote` / `fallback` both compact instead. What happens when that fails is decided here too: an unsaved
manual checkpoint keeps the window (seed 000), the trigger compacts, and a notes window opens all the same
where nothing could be compacted."""

from __future__ import annotations

from typing import Literal

from proxy.windows.notes.rollover import Kind

# What the context stage always consumes at a request: `new_context`. A manual checkpoint is consumed only
# where something can serve it (`pending_kinds`); else it waits.
ROLLOVER_KINDS: tuple[Kind, ...] = ("new_context",)
SERVED = ("checkpoint", "threshold")  # the kinds served by a checkpoint turn or a compaction


def pending_kinds(strategy: str, has_tool_server: bool) -> tuple[Kind, ...]:
    """The kinds taken at this request. A manual checkpoint is served by the checkpoint turn, which offers the
    own-notes write tool itself (whether or not the agent declares it: issue 29 (2)), or by a compaction: it
    waits only for a tool server to run the write."""
    return (*ROLLOVER_KINDS, "checkpoint") if strategy != "notes" or has_tool_server else ROLLOVER_KINDS


def trigger_kind(can_turn: bool, strategy: str, hard: bool) -> str | None:
    """"threshold" when nothing is pending and the hard trigger is reached (and something can serve it)."""
    return "threshold" if (can_turn or strategy != "notes") and hard else None


def compacts_first(kind: str | None, strategy: str) -> bool:
    """Remote compaction (where eligible) or the readable fallback, instead of the checkpoint turn."""
    return kind in SERVED and strategy != "notes"


def after_compaction(kind: str | None, made: str) -> str | None:
    """The kind left to serve after a compaction made `made` (a strategy, or `none`): nothing when one was made;
    else a manual checkpoint still rolls over (a notes window), the trigger does not."""
    if made != "none":
        return None
    return "checkpoint_failed" if kind == "checkpoint" else None


def runs_turn(kind: str | None) -> bool:
    return kind in SERVED


def after_turn(kind: str, outcome: str) -> Literal["roll", "keep", "compact"]:
    """After the checkpoint turn: a written note rolls over; an unsaved manual checkpoint keeps the current
    window (seed 000: only a saved own-notes write lets the window go); the hard trigger compacts (remote where
    eligible, else readable)."""
    if outcome == "written":
        return "roll"
    return "keep" if kind == "checkpoint" else "compact"
