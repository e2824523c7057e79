"""Everything that can be checked before a file changes, and every new content computed in memory.

Preflight reads; it never writes. It refuses: paths outside the working directory, symlinks,
two operations on one path (or on a path and its parent), directories and special files as
targets, sources that are not UTF-8 text with uniform LF or CRLF endings, and chunks that do
not match exactly one place. What it returns is a plan that commit can carry out in order.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

from tools_server.patch.matcher import apply_chunks
from tools_server.patch.model import AddFile, DeleteFile, Hunk, Patch, PatchError, UpdateFile
from tools_server.patch.paths import Target, WorkDir, check_components, lexical_target
from tools_server.patch.text import check_no_cr, decode_source, encode_lines

MAX_FILE_BYTES = 16 * 1024 * 1024

Fingerprint = tuple[int, int, int, int]  # dev, inode, size, mtime_ns: "is this the file we read?"
OpKind = Literal["add", "delete", "update", "move"]


@dataclass
class Operation:
    kind: OpKind
    hunk: Hunk
    target: Target  # the file added, deleted or updated (the source of a move)
    dest: Target | None = None  # a move's destination
    data: bytes | None = None  # new content (None for delete)
    mode: int = 0o644  # permission bits of the written file
    before: Fingerprint | None = None  # the target as preflight saw it (None: absent)
    dest_before: Fingerprint | None = None
    unchanged: bool = False  # an update whose bytes and place stay the same: nothing to write

    @property
    def written(self) -> Target | None:
        """The path that receives `data`."""
        if self.kind == "delete":
            return None
        return self.dest if self.kind == "move" else self.target


@dataclass
class Plan:
    cwd: WorkDir
    operations: list[Operation]


def fingerprint(st: os.stat_result | None) -> Fingerprint | None:
    if st is None:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def preflight(patch: Patch, cwd: WorkDir, new_file_mode: int) -> Plan:
    if not patch.hunks:
        raise PatchError(
            "No files were modified: the patch has no '*** Add File', '*** Delete File' or "
            "'*** Update File' section",
            code="empty_patch",
        )
    resolved = [_resolve(cwd, hunk) for hunk in patch.hunks]
    _check_conflicts(resolved)
    operations = [_inspect(cwd, hunk, target, dest, new_file_mode) for hunk, target, dest in resolved]
    return Plan(cwd=cwd, operations=operations)


def _resolve(cwd: WorkDir, hunk: Hunk) -> tuple[Hunk, Target, Target | None]:
    target = lexical_target(cwd, hunk.path)
    dest = None
    if isinstance(hunk, UpdateFile) and hunk.move_to is not None:
        dest = lexical_target(cwd, hunk.move_to)
        if dest.path == target.path:
            dest = None  # moving a file onto itself is an in-place update
    return hunk, target, dest


def _check_conflicts(resolved: list[tuple[Hunk, Target, Target | None]]) -> None:
    seen: dict[str, tuple[Target, Hunk]] = {}
    for hunk, target, dest in resolved:
        for t in (target, dest):
            if t is None:
                continue
            if t.path in seen:
                other, other_hunk = seen[t.path]
                raise PatchError(
                    f"'{other.raw}' (line {other_hunk.line}) and '{t.raw}' (line {hunk.line}) name the "
                    "same file; put all changes to one file in one hunk (an Update File hunk can hold "
                    "several @@ chunks)",
                    code="path_conflict",
                )
            seen[t.path] = (t, hunk)
    for path, (target, hunk) in seen.items():
        parent = os.path.dirname(path)
        while parent and parent != os.path.dirname(parent):
            if parent in seen:
                other, other_hunk = seen[parent]
                raise PatchError(
                    f"'{other.raw}' (line {other_hunk.line}) is a parent directory of '{target.raw}' "
                    f"(line {hunk.line}); one patch cannot use a path both as a file and as a directory",
                    code="path_conflict",
                )
            parent = os.path.dirname(parent)


def _inspect(cwd: WorkDir, hunk: Hunk, target: Target, dest: Target | None, new_file_mode: int) -> Operation:
    st = check_components(cwd, target)
    if isinstance(hunk, AddFile):
        _writable_target(st, target, "Add File")
        lines = hunk.contents.split("\n")
        check_no_cr(lines, f"'{target.raw}'")
        mode = stat.S_IMODE(st.st_mode) & 0o777 if st is not None else new_file_mode
        return Operation("add", hunk, target, data=hunk.contents.encode("utf-8"), mode=mode,
                         before=fingerprint(st))
    if isinstance(hunk, DeleteFile):
        if st is None:
            raise PatchError(f"Failed to delete file '{target.raw}': it does not exist", code="not_found")
        _regular_source(st, target, "Delete File")
        decode_source(_read(target), f"'{target.raw}'")  # binary deletes are not supported
        return Operation("delete", hunk, target, before=fingerprint(st))
    assert isinstance(hunk, UpdateFile)
    if st is None:
        raise PatchError(
            f"Failed to read file to update '{target.raw}': it does not exist (use '*** Add File' to "
            "create a file)",
            code="not_found",
        )
    _regular_source(st, target, "Update File")
    original = _read(target)
    source = decode_source(original, f"'{target.raw}'")
    for chunk in hunk.chunks:
        check_no_cr([line for line, ref in zip(chunk.new, chunk.new_ref, strict=True) if ref is None],
                    f"'{target.raw}'")
    new_lines = apply_chunks(source.lines, hunk.chunks, target.raw)
    data = encode_lines(new_lines, source)
    mode = stat.S_IMODE(st.st_mode) & 0o777
    if dest is None:
        return Operation("update", hunk, target, data=data, mode=mode, before=fingerprint(st),
                         unchanged=data == original)
    dest_st = check_components(cwd, dest)
    _writable_target(dest_st, dest, "Move to")
    return Operation("move", hunk, target, dest=dest, data=data, mode=mode, before=fingerprint(st),
                     dest_before=fingerprint(dest_st))


def _writable_target(st: os.stat_result | None, target: Target, what: str) -> None:
    if st is None or stat.S_ISREG(st.st_mode):
        return
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    raise PatchError(f"{what} target '{target.raw}' is {kind}; apply_patch only writes regular files",
                     code="not_a_file")


def _regular_source(st: os.stat_result, target: Target, what: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
    raise PatchError(f"{what} '{target.raw}' is {kind}; apply_patch only edits and deletes regular files",
                     code="not_a_file")


def _read(target: Target) -> bytes:
    fd = os.open(target.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise PatchError(
            f"'{target.raw}' is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; apply_patch does not "
            "edit files that large",
            code="too_large",
        )
    return data
