"""Note files: `<state>/notes/<task>/<agent-hash>/<path>`, real files the user can open.

Beside the agents' trees, `<state>/notes/<task>/.ctp/<agent-hash>/` holds what the model never
sees: per-file metadata (`meta/<path>.json`, with `created_at`), lock files and temporary files.
A write or an append takes the file's cross-process lock (`filelock`, an OS lock the kernel drops
when its holder dies), checks the byte cap, reads the old content, writes a temporary file, fsyncs
it, renames it over the note and updates the metadata, all under the lock. Reads take no lock: a
rename is atomic, so a read sees the old or the new content, and a read after a successful write
sees it. Lock waits are bounded (`lock_timeout`) and fail with a clear error.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from filelock import FileLock, Timeout

from proxy.journal.addresses import address_hash
from proxy.notes.paths import NotePathError, check_task_id

NOTE_MAX_BYTES = 1_000_000
LOCK_TIMEOUT = 10.0
_META_DIR = ".ctp"


class NoteError(Exception):
    """An error the model sees; says what to do instead."""


@dataclass(frozen=True)
class NoteInfo:
    rel: str
    bytes: int
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class WriteResult:
    bytes: int  # the file's size after the write
    written: int  # bytes written by this call
    created: bool


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


class NotesStore:
    """The notes of one task."""

    def __init__(self, notes_root: Path, task_id: str, max_bytes: int = NOTE_MAX_BYTES,
                 lock_timeout: float = LOCK_TIMEOUT):
        self.task_dir = notes_root / check_task_id(task_id)
        self.max_bytes = max_bytes
        self.lock_timeout = lock_timeout

    # -------------------------------------------------------------- layout
    def agent_dir(self, address: str) -> Path:
        return self.task_dir / address_hash(address)

    def _private(self, address: str) -> Path:
        return self.task_dir / _META_DIR / address_hash(address)

    def _file(self, address: str, rel: str) -> Path:
        root = self.agent_dir(address)
        path = root.joinpath(*rel.split("/"))
        if os.path.commonpath([os.path.realpath(path), os.path.realpath(root)]) != os.path.realpath(root):
            raise NotePathError(f"invalid note path {rel!r}: it leaves the notes directory")
        return path

    def _meta(self, address: str, rel: str) -> Path:
        parts = rel.split("/")
        return self._private(address).joinpath("meta", *parts[:-1], parts[-1] + ".json")

    def _lock(self, address: str, rel: str) -> FileLock:
        name = hashlib.sha256(rel.encode("utf-8")).hexdigest()[:32]
        locks = self._private(address) / "locks"
        locks.mkdir(parents=True, exist_ok=True, mode=0o700)
        return FileLock(str(locks / f"{name}.lock"), timeout=self.lock_timeout)

    def _ensure_agent(self, address: str) -> None:
        private = self._private(address)
        if not (private / "address").exists():
            private.mkdir(parents=True, exist_ok=True, mode=0o700)
            (private / "address").write_text(address + "\n", encoding="utf-8")
        self.agent_dir(address).mkdir(parents=True, exist_ok=True, mode=0o700)

    # -------------------------------------------------------------- reads
    def read(self, address: str, rel: str) -> str:
        path = self._file(address, rel)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise NoteError(f"note {rel!r} does not exist; list notes with notes_list_files_by_prefix") from None
        except IsADirectoryError:
            raise NoteError(f"{rel!r} is a directory; list it with notes_list_files_by_prefix") from None
        return data.decode("utf-8", errors="replace")

    def created_at(self, address: str, rel: str, fallback: float) -> float:
        try:
            return float(orjson.loads(self._meta(address, rel).read_bytes())["created_at"])
        except (FileNotFoundError, KeyError, ValueError, orjson.JSONDecodeError):
            return fallback

    def iter_files(self, address: str) -> Iterator[NoteInfo]:
        """Every note of the agent (committed files only; temporaries live elsewhere)."""
        root = self.agent_dir(address)
        if not root.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            base = Path(dirpath)
            for name in sorted(filenames):
                path = base / name
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                rel = path.relative_to(root).as_posix()
                yield NoteInfo(rel, st.st_size, self.created_at(address, rel, st.st_mtime), st.st_mtime)

    # -------------------------------------------------------------- writes
    def write(self, address: str, rel: str, text: str) -> WriteResult:
        return self._commit(address, rel, text.encode("utf-8"), append=False)

    def append(self, address: str, rel: str, text: str) -> WriteResult:
        return self._commit(address, rel, text.encode("utf-8"), append=True)

    def _commit(self, address: str, rel: str, data: bytes, append: bool) -> WriteResult:
        path = self._file(address, rel)
        self._ensure_agent(address)
        try:
            with self._lock(address, rel):
                return self._commit_locked(address, rel, path, data, append)
        except Timeout:
            raise NoteError(f"note {rel!r} is busy: another writer held its lock for {self.lock_timeout:g} s; "
                            "retry the call") from None

    def _commit_locked(self, address: str, rel: str, path: Path, data: bytes, append: bool) -> WriteResult:
        if path.is_dir():
            raise NoteError(f"{rel!r} is a directory; choose a file name inside it")
        old: bytes | None = None
        if append:
            try:
                old = path.read_bytes()
            except FileNotFoundError:
                old = None
            existed = old is not None
        else:
            existed = path.exists()
        new = (old or b"") + data if append else data
        if len(new) > self.max_bytes:
            have = len(old or b"") if append else 0
            raise NoteError(
                f"note {rel!r} would be {len(new)} bytes; the limit is {self.max_bytes} UTF-8 bytes per file"
                + (f" (it has {have}; {self.max_bytes - have} left)" if append else "")
                + ". Write a shorter text or start another note.")
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except (FileExistsError, NotADirectoryError):
            raise NoteError(f"cannot create {rel!r}: a parent component is a file") from None
        now = time.time()
        meta = self._meta(address, rel)
        if not existed or not meta.exists():
            created = now if not existed else path.stat().st_mtime
            self._atomic(address, meta, orjson.dumps({"path": rel, "created_at": created}))
        self._atomic(address, path, new)
        return WriteResult(len(new), len(data), not existed)

    def _atomic(self, address: str, target: Path, data: bytes) -> None:
        tmpdir = self._private(address) / "tmp"
        tmpdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=tmpdir, prefix="w.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp, 0o600)
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
