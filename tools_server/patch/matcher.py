"""Where each chunk of an Update hunk applies, and the lines that result (pure, no I/O).

Chunks are located in file order against the original lines, each search starting after the
previous match. Three tiers, strictest first: exact, ignoring trailing whitespace, ignoring
surrounding whitespace. The first tier that yields any candidate must yield exactly one;
several candidates is an ambiguity error, never a guess. When no tier matches and the old
lines end with an empty line, the chunk is retried without it (and without an empty last new
line), as Codex does, but never down to an empty pattern.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable

from tools_server.patch.model import Chunk, PatchError

_TIERS: tuple[Callable[[str], str], ...] = (lambda s: s, str.rstrip, str.strip)
_SHOWN_CHUNK_LINES = 30
_SCAN_UP_TO_CHUNKS = 4


class LineIndex:
    """The file's lines per tier, with a map from each wanted normalised line to its positions."""

    def __init__(self, lines: list[str], wanted: set[str] | None = None):
        self.lines = lines
        # The first lines of the patterns that will be searched: only they need a position map.
        # Without them (a chunk or two) scanning is cheaper than building any map.
        self.wanted = wanted
        self._norm: dict[int, list[str]] = {0: lines}
        self._positions: dict[int, dict[str, list[int]]] = {}
        self._keys: dict[int, set[str]] = {}

    def norm(self, tier: int) -> list[str]:
        if tier not in self._norm:
            self._norm[tier] = [_TIERS[tier](line) for line in self.lines]
        return self._norm[tier]

    def positions(self, tier: int, key: str) -> list[int]:
        """Where the (normalised) line `key` occurs, ascending."""
        keys = None
        if self.wanted is not None:
            keys = self._keys.get(tier)
            if keys is None:
                keys = self._keys[tier] = {_TIERS[tier](k) for k in self.wanted}
        if keys is not None and key not in keys:  # not prepared for: look it up directly
            return [i for i, line in enumerate(self.norm(tier)) if line == key]
        table = self._positions.get(tier)
        if table is None:
            table = self._positions[tier] = {}
            for i, line in enumerate(self.norm(tier)):
                if keys is None or line in keys:
                    table.setdefault(line, []).append(i)
        return table.get(key, [])

    def find(self, pattern: list[str], start: int, at_end: bool, limit: int = 3) -> list[int]:
        """Candidate start positions from the first tier that has any (at most `limit`)."""
        size, count = len(pattern), len(self.lines)
        if not pattern or size > count:
            return []
        last = count - size
        for tier, fn in enumerate(_TIERS):
            want = [fn(p) for p in pattern] if tier else pattern
            norm = self.norm(tier)
            if at_end:
                # `*** End of File`: only the position that ends at the last line counts.
                found = [last] if last >= start and norm[last:count] == want else []
            elif tier == 0 and self.wanted is None:
                found = self._scan(want, start, last, limit)
            else:
                found = []
                spots = self.positions(tier, want[0])
                for pos in spots[bisect_left(spots, start):]:
                    if pos > last:
                        break
                    if norm[pos:pos + size] == want:
                        found.append(pos)
                        if len(found) >= limit:
                            break
            if found:
                return found
        return []


    def _scan(self, pattern: list[str], start: int, last: int, limit: int) -> list[int]:
        """Exact candidates by `list.index` (a C loop: the exact tier is the common one)."""
        lines, first, size = self.lines, pattern[0], len(pattern)
        found: list[int] = []
        pos = start
        while pos <= last:
            try:
                pos = lines.index(first, pos, last + 1)
            except ValueError:
                break
            if lines[pos:pos + size] == pattern:
                found.append(pos)
                if len(found) >= limit:
                    break
            pos += 1
        return found


def apply_chunks(lines: list[str], chunks: list[Chunk], label: str) -> list[str]:
    """The new lines of a file after all chunks, or a PatchError naming the chunk that fails."""
    wanted = None
    if len(chunks) > _SCAN_UP_TO_CHUNKS:
        wanted = {c.old[0] for c in chunks if c.old} | {c.context for c in chunks if c.context is not None}
    index = LineIndex(lines, wanted)
    cursor = 0
    edits: list[tuple[int, int, int, list[str]]] = []  # (start, old length, order, new lines)
    for order, chunk in enumerate(chunks):
        if chunk.context is not None:
            spots = index.find([chunk.context], cursor, at_end=False, limit=1)
            if not spots:
                raise PatchError(
                    f"Failed to find context '{chunk.context}' in {label} (chunk at patch line "
                    f"{chunk.line}); the '@@' text must repeat one line of the file. Re-read the file.",
                    code="context_mismatch",
                    details={"path": label, "patch_line": chunk.line},
                )
            cursor = spots[0] + 1
        if not chunk.old:
            # A pure addition goes at the end of the file (before a final blank line), as in Codex.
            at = len(lines) - 1 if lines and lines[-1] == "" else len(lines)
            edits.append((at, 0, order, list(chunk.new)))
            continue
        pattern, new, refs = chunk.old, chunk.new, chunk.new_ref
        spots = index.find(pattern, cursor, chunk.end_of_file)
        if not spots and len(pattern) > 1 and pattern[-1] == "":
            pattern = pattern[:-1]
            if new and new[-1] == "":
                new, refs = new[:-1], refs[:-1]
            spots = index.find(pattern, cursor, chunk.end_of_file)
        if not spots:
            raise PatchError(
                f"Failed to find expected lines in {label} (chunk at patch line {chunk.line}):\n"
                f"{_show(chunk)}\nRe-read the file and copy the context and '-' lines exactly as "
                "they are now.",
                code="context_mismatch",
                details={"path": label, "patch_line": chunk.line},
            )
        if len(spots) > 1:
            where = ", ".join(str(s + 1) for s in spots[:2])
            count = f"{len(spots)}" if len(spots) < 3 else "3 or more"
            raise PatchError(
                f"The chunk at patch line {chunk.line} matches {count} places in {label} (lines "
                f"{where}{', …' if len(spots) > 2 else ''}):\n{_show(chunk)}\nAdd unchanged context "
                "lines or an '@@ <line>' locator above it so that it matches one place.",
                code="ambiguous_context",
                details={"path": label, "patch_line": chunk.line, "candidate_lines": [s + 1 for s in spots]},
            )
        at = spots[0]
        # Context lines keep the file's own spelling (a whitespace-tolerant match must not
        # rewrite the whitespace of lines the patch did not change).
        kept = [
            lines[at + ref] if ref is not None and ref < len(pattern) else text
            for text, ref in zip(new, refs, strict=True)
        ]
        edits.append((at, len(pattern), order, kept))
        cursor = at + len(pattern)
    return _merge(lines, edits)


def _merge(lines: list[str], edits: list[tuple[int, int, int, list[str]]]) -> list[str]:
    out: list[str] = []
    pos = 0
    for start, length, _order, new in sorted(edits, key=lambda e: (e[0], e[2])):
        if start > pos:
            out.extend(lines[pos:start])
        out.extend(new)
        pos = max(pos, start + length)
    out.extend(lines[pos:])
    return out


def _show(chunk: Chunk) -> str:
    shown = chunk.source[:_SHOWN_CHUNK_LINES]
    more = len(chunk.source) - len(shown)
    return "\n".join(shown) + (f"\n… ({more} more lines)" if more > 0 else "")
