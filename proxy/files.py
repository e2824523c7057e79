"""Atomic file writes: a durable temp file (fsync) beside the target or in a given directory, then rename.

The one implementation of it: config, state, run files, compaction keys, notes and apply_patch's
staged commit all write through `write_temp` (apply_patch renames its temp files itself, in order).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_temp(directory: str | Path, data: bytes, mode: int, prefix: str = ".", suffix: str = ".tmp") -> str:
    """A new file in `directory` holding `data`, flushed to disk, with `mode`; its path. Removed again
    when anything fails."""
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=prefix, suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644, tmp_dir: Path | None = None,
                       dir_mode: int = 0o777) -> None:
    """Replace `path` with `data` in one rename: readers see the old file or the new one, never a part.
    `tmp_dir` (same file system) holds the temp file instead of `path`'s directory."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=dir_mode)
    tmp = write_temp(tmp_dir or path.parent, data, mode, prefix=f".{path.name}." if tmp_dir is None else "w.")
    try:
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), mode)
