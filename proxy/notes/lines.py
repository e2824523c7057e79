"""Line ranges and character pages of note text (pure).

Lines are 1-based and inclusive; negative numbers count from the end (-1 is the last line).
A line ends with "\\n" (kept in the output). Character offsets are Unicode code points and apply
to the selected lines, so a single very long line can be read page by page.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.errors import CtproxyError


class LineRangeError(CtproxyError, ValueError):
    pass


def split_lines(text: str) -> list[str]:
    """Lines with their newline kept; a trailing newline does not start an empty line."""
    if not text:
        return []
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


@dataclass(frozen=True)
class LineSelection:
    first: int  # 1-based, 0 when nothing was selected
    last: int
    total: int
    text: str


def _absolute(n: int, total: int, name: str) -> int:
    if n == 0:
        raise LineRangeError(f"{name} must not be 0: lines are 1-based; use 1 for the first line, -1 for the last")
    return total + 1 + n if n < 0 else n


def select_lines(text: str, start_line: int | None, stop_line: int | None) -> LineSelection:
    lines = split_lines(text)
    total = len(lines)
    start = 1 if start_line is None else _absolute(start_line, total, "start_line")
    stop = total if stop_line is None else _absolute(stop_line, total, "stop_line")
    start, stop = max(start, 1), min(stop, total)
    if total == 0 or start > stop:
        return LineSelection(0, 0, total, "")
    return LineSelection(start, stop, total, "".join(lines[start - 1:stop]))
