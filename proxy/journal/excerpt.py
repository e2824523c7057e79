"""Text operations of the history tools (pure): previews, verified matches, match regions, pages.

Offsets are Unicode code points (Python `str` indices: an emoji is never split).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_REGIONS = 3


def preview(text: str, limit: int) -> str:
    """At most `limit` code points; a cut is marked with an ellipsis inside the limit."""
    if len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)] + "…"


def find_matches(text: str, segments: Sequence[Sequence[int]], query: str) -> list[tuple[int, int]]:
    """Every non-overlapping occurrence of `query` lying inside one searchable segment."""
    if not query:
        return []
    out: list[tuple[int, int]] = []
    q = len(query)
    for start, end in segments:
        pos = text.find(query, start, end)
        while pos != -1:
            out.append((pos, pos + q))
            pos = text.find(query, pos + q, end)
    out.sort()
    return out


@dataclass(frozen=True)
class Region:
    offset_chars: int
    limit_chars: int
    matches: tuple[tuple[int, int], ...]
    text: str


def _group(text_len: int, matches: Sequence[tuple[int, int]], width: int) -> list[list]:
    groups: list[list] = []  # [start, end, matches]
    for s, e in matches:
        if groups and s < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], e)  # inside (or straddling) the previous region
            groups[-1][2].append((s, e))
            continue
        if len(groups) == MAX_REGIONS:
            break
        span = max(width, e - s)
        start = max(0, s - (span - (e - s)) // 2)
        end = min(text_len, start + span)
        start = max(0, end - span)
        if groups:
            start = max(start, groups[-1][1])  # regions never overlap
        groups.append([start, max(end, e), [(s, e)]])
    return groups


def regions(text: str, matches: Sequence[tuple[int, int]], budget: int) -> list[Region]:
    """Up to three regions around the matches sharing `budget` code points of context; each region's
    (offset_chars, limit_chars) reads back exactly its text with history_read_item."""
    if not matches:
        return []
    groups = _group(len(text), matches, max(budget // MAX_REGIONS, 1))
    groups = _group(len(text), matches, max(budget // len(groups), 1))
    return [Region(s, e - s, tuple(ms), text[s:e]) for s, e, ms in groups]


@dataclass(frozen=True)
class Page:
    offset: int  # actual start (clamped to the text)
    end: int
    total: int
    text: str

    @property
    def next_offset(self) -> int | None:
        return self.end if self.end < self.total else None


def page(text: str, offset: int, limit: int) -> Page:
    """text[offset:offset+limit] with the offset clamped to the end; limit ≥ 1."""
    total = len(text)
    start = min(max(offset, 0), total)
    end = min(start + max(limit, 1), total)
    return Page(start, end, total, text[start:end])
