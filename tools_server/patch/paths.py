"""Where a patch may write: the working directory of a call, and paths contained in it.

This is a static containment check, not a race-proof sandbox: it looks at the file system
before anything is written (`lstat` of every existing component), and a process that swaps a
directory for a symlink between that check and the commit is not stopped.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from tools_server.patch.model import PatchError

# What POSIX file systems accept (NAME_MAX, PATH_MAX - 1); longer names fail with ENAMETOOLONG.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4095


@dataclass(frozen=True)
class WorkDir:
    """The canonical working directory of a call, and the spelling the caller used for it."""

    real: str  # realpath, the containment root
    spelled: str  # absolute and normalised, symlinks not resolved (absolute patch paths may use it)


@dataclass(frozen=True)
class Target:
    raw: str  # as written in the patch: what the model sees in messages
    path: str  # absolute, normalised, under WorkDir.real


def working_dir(workspace: Path, *relative: str | os.PathLike[str] | None) -> WorkDir:
    """Resolve the workspace, then each given directory in turn (relative ones against the last)."""
    real = os.path.realpath(workspace)
    spelled = os.path.normpath(os.path.abspath(workspace))
    for part in relative:
        if part is None or os.fspath(part) == "":
            continue
        part = os.fspath(part)
        if "\x00" in part:
            raise PatchError("a working directory name contains a NUL character", code="bad_cwd")
        candidate_spelled = os.path.normpath(os.path.join(spelled, part))
        candidate_real = os.path.realpath(os.path.join(real, part))
        root = os.path.realpath(workspace)
        if not _within(candidate_real, root, allow_equal=True):
            raise PatchError(
                f"working directory '{shown_path(part)}' is outside the workspace; give a directory inside it",
                code="outside_workspace",
            )
        if not os.path.isdir(candidate_real):
            raise PatchError(f"working directory '{shown_path(part)}' does not exist or is not a directory",
                             code="bad_cwd")
        real = candidate_real
        spelled = candidate_spelled
    if not os.path.isdir(real):
        raise PatchError("the workspace directory does not exist", code="bad_cwd")
    return WorkDir(real=real, spelled=spelled)


def shown_path(raw: str, limit: int = 200) -> str:
    """A path as quoted in an error message: long ones are cut, so the message stays short."""
    return raw if len(raw) <= limit else f"{raw[:limit]}… ({len(raw)} characters)"


def check_lengths(raw: str, path: str) -> None:
    """Refuse names no file system accepts, before any system call would fail on them."""
    for part in path.split(os.sep):
        if len(os.fsencode(part)) > MAX_NAME_BYTES:
            raise PatchError(f"'{shown_path(raw)}' has a file or directory name longer than {MAX_NAME_BYTES} "
                             "bytes; use shorter names", code="bad_path")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise PatchError(f"'{shown_path(raw)}' is longer than {MAX_PATH_BYTES} bytes as an absolute path; "
                         "use a shorter path", code="bad_path")


def lexical_target(cwd: WorkDir, raw: str) -> Target:
    """The absolute path `raw` names, refused when it leaves the working directory (no I/O)."""
    if "\x00" in raw:
        raise PatchError("a path in the patch contains a NUL character", code="bad_path")
    if os.path.isabs(raw):
        norm = os.path.normpath(raw)
        if not _within(norm, cwd.real) and _within(norm, cwd.spelled):
            norm = os.path.join(cwd.real, os.path.relpath(norm, cwd.spelled))
    else:
        norm = os.path.normpath(os.path.join(cwd.real, raw))
    if norm == cwd.real:
        raise PatchError(f"'{shown_path(raw)}' names the working directory itself, not a file", code="bad_path")
    if not _within(norm, cwd.real):
        raise PatchError(
            f"'{shown_path(raw)}' resolves outside the working directory; use a path relative to it, inside it",
            code="outside_workspace",
        )
    check_lengths(raw, norm)
    return Target(raw=raw, path=norm)


def check_components(cwd: WorkDir, target: Target) -> os.stat_result | None:
    """Refuse symlinks and non-directories on the way to `target`; return its lstat (None if absent)."""
    rel = os.path.relpath(target.path, cwd.real)
    parts = rel.split(os.sep)
    current = cwd.real
    for i, part in enumerate(parts):
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            return None
        except NotADirectoryError:
            return None
        except OSError as exc:  # too long, a loop, no permission: a clear refusal, not a crash
            raise PatchError(f"'{shown_path(target.raw)}' cannot be inspected ({exc.strerror or type(exc).__name__})",
                             code="bad_path") from None
        shown = os.path.join(*parts[: i + 1])
        if stat.S_ISLNK(st.st_mode):
            raise PatchError(
                f"'{target.raw}' goes through a symbolic link ('{shown}'); apply_patch does not follow "
                "symlinks: patch the real path instead",
                code="symlink",
            )
        last = i == len(parts) - 1
        if not last and not stat.S_ISDIR(st.st_mode):
            raise PatchError(f"'{target.raw}' cannot be used: '{shown}' is a file, not a directory",
                             code="not_a_directory")
        if last:
            return st
    return None


def nearest_existing_dir(path: str, root: str) -> str:
    """The closest existing ancestor directory of `path` (the root at worst)."""
    current = os.path.dirname(path)
    while current != root and not os.path.isdir(current):
        current = os.path.dirname(current)
    return current


def _within(path: str, root: str, allow_equal: bool = False) -> bool:
    if path == root:
        return allow_equal
    return path.startswith(root.rstrip(os.sep) + os.sep)
