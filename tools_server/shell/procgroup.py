"""Process-group probes and signals (POSIX).

A group counts as gone when no live member is left. Zombies do not count: an init that
never reaps (common in containers) would otherwise keep every finished group "alive".
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the group; False when the group no longer exists."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # a member we cannot signal still exists
    return True


def live_members(pgid: int) -> list[int]:
    """Blocking: pids of non-zombie processes whose process group is `pgid` (Linux /proc)."""
    members = []
    try:
        entries = os.listdir(_PROC)
    except OSError:
        return members
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        # comm may contain spaces or parentheses: fields start after the last ')'
        fields = raw[raw.rfind(b")") + 2:].split()
        if len(fields) < 3:
            continue
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def group_alive(pgid: int) -> bool:
    """Blocking: whether any live process remains in the group."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not _PROC.is_dir():
        return True  # without /proc, a zombie-only group cannot be told apart
    return bool(live_members(pgid))
