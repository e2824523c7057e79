"""Processes on this machine, for tests that check nothing was left running."""

from __future__ import annotations

from pathlib import Path


def processes_mentioning(*needles: str) -> list[int]:
    """Live (non-zombie) processes whose command line contains every needle."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            zombie = (proc / "stat").read_text().split()[2] == "Z"
        except OSError:
            continue
        if not zombie and all(n in cmd for n in needles):
            found.append(int(proc.name))
    return found
