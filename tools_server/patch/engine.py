"""One patch, start to finish, synchronously: preflight, stage, last cancel check, commit.

Runs in a worker thread; `cancelled()` is polled between phases and never after the commit
has begun (a commit is carried through so its report stays exact).
"""

from __future__ import annotations

import os
from collections.abc import Callable

from tools_server.patch.commit import LOCAL_FS, CommitReport, LocalFs, commit, discard, stage
from tools_server.patch.model import Patch, PatchError
from tools_server.patch.paths import WorkDir
from tools_server.patch.preflight import preflight


class PatchCancelled(PatchError):
    def __init__(self) -> None:
        super().__init__("apply_patch was cancelled before any file changed", code="cancelled")


def apply_patch(
    patch: Patch,
    cwd: WorkDir,
    cancelled: Callable[[], bool] = lambda: False,
    fs: LocalFs = LOCAL_FS,
    new_file_mode: int | None = None,
) -> CommitReport:
    if cancelled():
        raise PatchCancelled()
    try:
        plan = preflight(patch, cwd, new_file_mode if new_file_mode is not None else default_file_mode())
    except OSError as exc:  # e.g. a file that cannot be read: nothing was written yet
        raise PatchError(
            f"could not read the files the patch names ({exc.strerror or exc.__class__.__name__}); "
            "nothing was changed",
            code="preflight_failed",
        ) from None
    if cancelled():
        raise PatchCancelled()
    try:
        staged = stage(plan, fs)
    except OSError as exc:
        raise PatchError(
            f"could not stage the new file contents ({exc.strerror or exc.__class__.__name__}); "
            "nothing was changed",
            code="stage_failed",
        ) from None
    if cancelled():  # the last check: after this the commit runs to the end
        discard(staged)
        raise PatchCancelled()
    return commit(plan, staged, fs)


def default_file_mode() -> int:
    """0o666 minus the process umask, read without changing it (os.umask would race other threads)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o644 if os.name == "posix" else 0o666
