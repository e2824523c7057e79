"""Tool discovery's pure rules (seed 004 §4.8, §5.8, §7): what `find_tools` finds, what it may load, and
which tool specs a bridged request carries. No I/O: the family (family.py) and the bridge call these.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

MAX_HITS = 8
FIND_TOOLS = "find_tools"
COMPUTER_USE_GROUP = ("computer_use_list_apps", "computer_use_get_app_state", "computer_use_click",
                      "computer_use_type_text", "computer_use_press_key", "computer_use_scroll")
PAIRS = (("exec_command", "write_stdin"), ("exec", "wait"))  # loading one needs both eligible
DEFAULT_DEFERRED = ("openai_generate_image", *COMPUTER_USE_GROUP)


@dataclass(frozen=True)
class ToolEntry:
    """What discovery knows of one of ctproxy's own tools."""

    name: str
    description: str
    unavailable: str | None = None  # None: its feature is on; else why it cannot be called


@dataclass(frozen=True)
class Hit:
    name: str
    summary: str
    status: str  # "active" | "eligible" | "unavailable: <reason>"


@dataclass(frozen=True)
class LoadOutcome:
    loaded: tuple[str, ...] = ()  # newly added to the session
    already: tuple[str, ...] = ()  # active before (loaded earlier, or never deferred): a no-op
    rejected: tuple[tuple[str, str], ...] = ()  # (name, reason)
    session_loads: frozenset[str] = field(default_factory=frozenset)  # the session's loads afterwards


def summary(description: str, limit: int = 120) -> str:
    """The first sentence (or line) of a description, at most `limit` characters."""
    line = description.strip().splitlines()[0] if description.strip() else ""
    match = re.match(r"(.+?[.!?])(\s|$)", line)
    text = match.group(1) if match else line
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def status_of(entry: ToolEntry, deferred: frozenset[str], loaded: frozenset[str]) -> str:
    if entry.unavailable is not None:
        return f"unavailable: {entry.unavailable}"
    if entry.name in deferred and entry.name not in loaded:
        return "eligible"
    return "active"


def _terms(text: str) -> list[str]:
    return [t for t in re.split(r"[^a-z0-9]+", text.lower()) if t]


def search(query: str, entries: Sequence[ToolEntry], deferred: Iterable[str], loaded: Iterable[str],
           limit: int = MAX_HITS) -> list[Hit]:
    """Names first (exact, prefix, substring), then descriptions (all terms, then any); at most `limit`."""
    deferred_set, loaded_set = frozenset(deferred), frozenset(loaded)
    q = query.strip().lower()
    terms = _terms(q)
    if not q:
        return []
    scored: list[tuple[int, str, ToolEntry]] = []
    for entry in entries:
        name = entry.name.lower()
        words = set(_terms(entry.name)) | set(_terms(entry.description))
        haystack = f"{name} {entry.description.lower()}"
        if name == q:
            score = 100
        elif name.startswith(q):
            score = 80
        elif q in name:
            score = 60
        elif terms and all(t in words or t in haystack for t in terms):
            score = 40 + sum(1 for t in terms if t in name)
        elif any(t in words for t in terms):
            score = 10 + sum(1 for t in terms if t in words)
        else:
            continue
        scored.append((score, entry.name, entry))
    scored.sort(key=lambda s: (-s[0], s[1]))
    return [Hit(e.name, summary(e.description), status_of(e, deferred_set, loaded_set))
            for _, _, e in scored[:limit]]


def load(names: Sequence[str], entries: Mapping[str, ToolEntry], deferred: Iterable[str],
         loaded: Iterable[str]) -> LoadOutcome:
    """Re-check each requested name and add the eligible ones to the session's loads, all at once.
    The Computer Use group loads all six or none; a shell or code pair member needs both eligible
    (only the requested one is activated)."""
    deferred_set, before = frozenset(deferred), frozenset(loaded)
    adding: list[str] = []
    already: list[str] = []
    rejected: list[tuple[str, str]] = []
    seen: set[str] = set()

    def why_not(name: str) -> str | None:
        entry = entries.get(name)
        if entry is None:
            return "not one of ctproxy's tools on this server"
        return entry.unavailable

    for name in names:
        if name in seen:
            continue
        seen.add(name)
        if (reason := why_not(name)) is not None:
            rejected.append((name, reason))
            continue
        if name not in deferred_set or name in before:
            already.append(name)
            continue
        if name in COMPUTER_USE_GROUP:
            bad = [(m, r) for m in COMPUTER_USE_GROUP if (r := why_not(m)) is not None]
            if bad:
                rejected.append((name, f"the Computer Use group loads together and {bad[0][0]} is "
                                       f"unavailable ({bad[0][1]})"))
                continue
            group = [m for m in COMPUTER_USE_GROUP if m in deferred_set and m not in before and m not in adding]
            adding.extend(group)
            seen.update(COMPUTER_USE_GROUP)
            continue
        pair = next((p for p in PAIRS if name in p), None)
        if pair is not None:
            sibling = pair[1] if pair[0] == name else pair[0]
            if (reason := why_not(sibling)) is not None:
                rejected.append((name, f"it works only with {sibling}, which is unavailable ({reason})"))
                continue
        adding.append(name)
    after = before | frozenset(adding)
    return LoadOutcome(tuple(adding), tuple(already), tuple(rejected), after)


def carried_tool_names(enabled: Sequence[str], deferred: Iterable[str], loaded: Iterable[str],
                       discovery_on: bool) -> list[str]:
    """Which of the enabled tools (registry order) a bridged request carries.

    Discovery off: every enabled tool but `find_tools`. On: `find_tools` and every enabled tool except
    the deferred names the session has not loaded. Loads of names that are no longer enabled carry
    nothing (their feature's own rule wins)."""
    if not discovery_on:
        return [n for n in enabled if n != FIND_TOOLS]
    hold = frozenset(deferred) - frozenset(loaded)
    return [n for n in enabled if n not in hold]


def check_deferred(deferred: Iterable[str]) -> str | None:
    """A configuration error in `tool_discovery.deferred`, or None."""
    names = set(deferred)
    group = names & set(COMPUTER_USE_GROUP)
    if group and group != set(COMPUTER_USE_GROUP):
        return ("tool_discovery.deferred must list all six Computer Use tools or none of them "
                f"(missing: {', '.join(sorted(set(COMPUTER_USE_GROUP) - group))})")
    if FIND_TOOLS in names:
        return "tool_discovery.deferred cannot hold find_tools itself"
    return None
