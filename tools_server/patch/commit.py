"""Stage every new content next to its target, then commit the operations in patch order.

Each path is replaced atomically (a temp file in the same file system, fsync, rename). A patch
with several operations is not a transaction: if one operation fails, the ones before it
stay committed, the ones after it are not attempted, nothing is rolled back or retried, and
the report says which is which. The failed operation's outcome is found by looking at the
file system afterwards (it is `unknown` when that cannot be told).
"""

from __future__ import annotations

import contextlib
import errno
import os
from dataclasses import dataclass, field
from typing import Literal

from proxy.errors import CtproxyError
from proxy.files import write_temp
from tools_server.patch.paths import nearest_existing_dir
from tools_server.patch.preflight import Fingerprint, Operation, Plan, fingerprint

Status = Literal["committed", "failed", "partial", "unknown", "not_attempted"]


class LocalFs:
    """The file-system calls commit makes; one object so tests can make a step fail."""

    def write_temp(self, directory: str, name: str, data: bytes, mode: int) -> str:
        return write_temp(directory, data, mode, prefix=f".{name}.", suffix=".ctp-patch")

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def sync_dir(self, path: str) -> None:
        """Make a rename durable; best effort (some file systems refuse fsync on directories)."""
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


LOCAL_FS = LocalFs()


class ChangedOnDisk(CtproxyError, OSError):
    """The file is not the one preflight read: something else wrote it in between."""


@dataclass
class OpResult:
    operation: Operation
    status: Status = "not_attempted"
    error: str | None = None


@dataclass
class CommitReport:
    results: list[OpResult]
    created_dirs: list[str] = field(default_factory=list)  # relative to the working directory
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def stage(plan: Plan, fs: LocalFs = LOCAL_FS) -> dict[int, str]:
    """Write every new content to a temp file beside its target; returns op index -> temp path."""
    staged: dict[int, str] = {}
    try:
        for i, op in enumerate(plan.operations):
            written = op.written
            if written is None or op.unchanged:
                continue
            assert op.data is not None
            directory = nearest_existing_dir(written.path, plan.cwd.real)
            staged[i] = fs.write_temp(directory, os.path.basename(written.path), op.data, op.mode)
    except BaseException:
        discard(staged)
        raise
    return staged


def discard(staged: dict[int, str]) -> None:
    for tmp in staged.values():
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def commit(plan: Plan, staged: dict[int, str], fs: LocalFs = LOCAL_FS) -> CommitReport:
    report = CommitReport(results=[OpResult(op) for op in plan.operations])
    try:
        for i, result in enumerate(report.results):
            op = result.operation
            touched: list[str] = []
            try:
                _commit_one(op, staged.get(i), plan.cwd.real, fs, report.created_dirs, touched)
                result.status = "committed"
            except Exception as exc:  # any failure mid-commit is reported, never retried
                # Before the first rename or unlink the file is certainly as it was.
                result.status = _probe(op, staged.get(i)) if touched else "failed"
                result.error = _describe(exc)
                report.error = f"{_verb(op)} '{op.target.raw}' failed: {result.error}"
                break
    finally:
        discard({i: t for i, t in staged.items() if os.path.lexists(t)})
    return report


def _commit_one(
    op: Operation, tmp: str | None, root: str, fs: LocalFs, created: list[str], touched: list[str]
) -> None:
    """Carry out one operation; `touched` gets each path just before a rename or unlink on it."""
    _expect(op.target.path, op.before)
    if op.kind == "delete":
        touched.append(op.target.path)
        fs.unlink(op.target.path)
        fs.sync_dir(os.path.dirname(op.target.path))
        return
    if op.unchanged:
        return
    written = op.written
    assert written is not None and tmp is not None
    if op.kind == "move":
        assert op.dest is not None
        _expect(op.dest.path, op.dest_before)
    _make_parents(written.path, root, fs, created)
    touched.append(written.path)
    fs.replace(tmp, written.path)
    fs.sync_dir(os.path.dirname(written.path))
    if op.kind == "move":
        touched.append(op.target.path)
        fs.unlink(op.target.path)
        fs.sync_dir(os.path.dirname(op.target.path))


def _expect(path: str, before: Fingerprint | None) -> None:
    try:
        now = fingerprint(os.lstat(path))
    except FileNotFoundError:
        now = None
    if now != before:
        raise ChangedOnDisk(errno.ESTALE, "the file changed on disk after apply_patch read it")


def _make_parents(path: str, root: str, fs: LocalFs, created: list[str]) -> None:
    missing: list[str] = []
    parent = os.path.dirname(path)
    while parent != root and not os.path.isdir(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for directory in reversed(missing):
        fs.mkdir(directory)
        created.append(os.path.relpath(directory, root))


def _probe(op: Operation, tmp: str | None) -> Status:
    """What a failed operation left behind, judged from the file system."""
    try:
        if op.kind == "delete":
            now = _fingerprint_of(op.target.path)
            if now == op.before:
                return "failed"
            return "committed" if now is None else "unknown"
        written = op.written
        assert written is not None
        tmp_left = tmp is not None and os.path.lexists(tmp)
        if op.kind == "move":
            assert op.dest is not None
            dest_written = _holds(op.dest.path, op.data) and not tmp_left
            dest_untouched = tmp_left and _fingerprint_of(op.dest.path) == op.dest_before
            source_now = _fingerprint_of(op.target.path)
            if dest_untouched and source_now == op.before:
                return "failed"
            if dest_written and source_now is None:
                return "committed"
            if dest_written and source_now == op.before:
                return "partial"
            return "unknown"
        if (tmp_left or op.unchanged) and _fingerprint_of(written.path) == op.before:
            return "failed"
        if not tmp_left and _holds(written.path, op.data):
            return "committed"
        return "unknown"
    except OSError:
        return "unknown"


def _fingerprint_of(path: str) -> Fingerprint | None:
    try:
        return fingerprint(os.lstat(path))
    except FileNotFoundError:
        return None


def _holds(path: str, data: bytes | None) -> bool:
    try:
        with open(path, "rb") as fh:
            return fh.read() == data
    except OSError:
        return False


def _describe(exc: Exception) -> str:
    if isinstance(exc, ChangedOnDisk):
        return str(exc.strerror)
    if isinstance(exc, OSError):
        reason = exc.strerror or exc.__class__.__name__
        return f"{reason} (errno {exc.errno})" if exc.errno else reason
    return exc.__class__.__name__


def _verb(op: Operation) -> str:
    return {"add": "adding", "delete": "deleting", "update": "updating", "move": "moving"}[op.kind]
