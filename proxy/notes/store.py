"""Note files: `<state>/notes/<task>/<agent-hash>/<path>`, real files the user can open.

Beside the agents' trees, `<state>/notes/<task>/.ctp/<agent-hash>/` holds what the model never
sees: per-file metadata (`meta/<path>.json`, with `created_at`), lock files and temporary files.
A write or an append takes the file's cross-process lock (`filelock`, an OS lock the kernel drops
when its holder dies), checks the byte cap, reads the old content, writes a temporary file, fsyncs
it, renames it over the note and updates the metadata, all under the lock. Reads take no lock: a
rename is atomic, so a read sees the old or the new content, and a read after a successful write
sees it. Lock waits are bounded (`lock_timeout`) and fail with a clear error.

Notes never follow symbolic links. Every path is checked component by component with `lstat`
below the agent's directory, and reads open with O_NOFOLLOW: a link (to a file or a directory,
inside or outside the notes) is refused by read/write/append and is not a note to list or search.
Like apply_patch's containment, this is a check made before the effect, not a race-proof sandbox:
a process that swaps a directory for a link between the check and the rename is not stopped.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
from filelock import FileLock, Timeout

from proxy.errors import CtproxyError
from proxy.files import atomic_write_bytes
from proxy.items.addresses import address_hash
from proxy.notes.paths import MAX_DEPTH, check_rel, check_task_id, is_valid_rel, quoted

NOTE_MAX_BYTES = 1_000_000
LOCK_TIMEOUT = 10.0
_META_DIR = ".ctp"
# No links followed; no blocking on a FIFO someone left in the tree (fstat then refuses it).
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file. FileNotFoundError / IsADirectoryError as usual; a symbolic link
    (ELOOP under O_NOFOLLOW) or a special file raises NoteError."""
    try:
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NoteError("is a symbolic link; notes never follow links") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "is a directory")
        if not stat.S_ISREG(mode):
            raise NoteError("is not a regular file") from None
        return fh.read()


class NoteError(CtproxyError):
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


def encode_note(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise NoteError("the text is not valid Unicode (it has a lone surrogate); send UTF-8 text") from None


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

    def _file(self, address: str, rel: str, *, create_parents: bool = False) -> Path:
        """`<agent dir>/<rel>`, checked component by component with lstat: a symbolic link or a file
        on the way is refused (notes never follow links, so nothing outside the notes directory is
        read or written through one). With `create_parents`, missing directories are made, one by one."""
        check_rel(rel)
        root = self.agent_dir(address)
        parts = rel.split("/")
        current = root
        for i, part in enumerate(parts):
            current = current / part
            last = i == len(parts) - 1
            try:
                st = os.lstat(current)
            except FileNotFoundError:
                if last or not create_parents:
                    return root.joinpath(*parts)
                try:
                    os.mkdir(current, 0o700)
                except FileExistsError:
                    pass  # made meanwhile: the lstat below judges what it is
                st = os.lstat(current)
            except OSError as exc:
                raise NoteError(f"note {quoted(rel)} cannot be used: {exc.strerror or type(exc).__name__}") from None
            if stat.S_ISLNK(st.st_mode):
                link = quoted("/".join(parts[:i + 1]))
                where = "is a symbolic link" if last else f"goes through a symbolic link ({link})"
                raise NoteError(f"note {quoted(rel)} {where}; notes never follow links: use another path") from None
            if not last and not stat.S_ISDIR(st.st_mode):
                raise NoteError(f"cannot use {quoted(rel)}: {quoted('/'.join(parts[:i + 1]))} is a file, "
                                "not a directory")
        return current

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
            data = _read_regular(path)
        except FileNotFoundError:
            raise NoteError(f"note {quoted(rel)} does not exist; list notes with notes_list_files_by_prefix") from None
        except IsADirectoryError:
            raise NoteError(f"{quoted(rel)} is a directory; list it with notes_list_files_by_prefix") from None
        except NoteError as exc:
            raise NoteError(f"note {quoted(rel)} {exc}") from None
        except OSError as exc:
            raise NoteError(f"note {quoted(rel)} cannot be read: {exc.strerror or type(exc).__name__}") from None
        return data.decode("utf-8", errors="replace")

    def created_at(self, address: str, rel: str, fallback: float) -> float:
        try:
            return float(orjson.loads(_read_regular(self._meta(address, rel)))["created_at"])
        except (OSError, NoteError, KeyError, TypeError, ValueError, orjson.JSONDecodeError):
            return fallback

    def iter_files(self, address: str) -> Iterator[NoteInfo]:
        """Every note of the agent: regular files whose paths the tools accept (committed files only;
        temporaries live elsewhere). Symbolic links are not notes: never listed, never followed."""
        root = self.agent_dir(address)
        if not root.is_dir():
            return
        for dirpath, dirnames, filenames in os.walk(root):  # followlinks=False: linked dirs are not entered
            base = Path(dirpath)
            depth = len(base.relative_to(root).parts)
            # Deeper than a note path may go: nothing there can be read, so nothing there is listed.
            dirnames[:] = sorted(d for d in dirnames if depth + 1 < MAX_DEPTH) if depth + 1 < MAX_DEPTH else []
            for name in sorted(filenames):
                path = base / name
                try:
                    st = os.lstat(path)
                except OSError:
                    continue  # removed meanwhile
                if not stat.S_ISREG(st.st_mode):
                    continue  # a link (to a file anywhere), a FIFO, a socket
                rel = path.relative_to(root).as_posix()
                if not is_valid_rel(rel):
                    continue  # a name the tools could not address (made outside them)
                yield NoteInfo(rel, st.st_size, self.created_at(address, rel, st.st_mtime), st.st_mtime)

    # -------------------------------------------------------------- writes
    def write(self, address: str, rel: str, text: str) -> WriteResult:
        return self._commit(address, rel, encode_note(text), append=False)

    def append(self, address: str, rel: str, text: str) -> WriteResult:
        return self._commit(address, rel, encode_note(text), append=True)

    def _commit(self, address: str, rel: str, data: bytes, append: bool) -> WriteResult:
        self._file(address, rel)  # refuse a bad path before taking any lock
        try:
            self._ensure_agent(address)
            with self._lock(address, rel):
                return self._commit_locked(address, rel, data, append)
        except Timeout:
            raise NoteError(f"note {quoted(rel)} is busy: another writer held its lock for {self.lock_timeout:g} s; "
                            "retry the call") from None
        except OSError as exc:  # a full disk, permissions: the rename never happened, the note is as it was
            raise NoteError(f"note {quoted(rel)} was not changed: {exc.strerror or type(exc).__name__}") from None

    def _commit_locked(self, address: str, rel: str, data: bytes, append: bool) -> WriteResult:
        path = self._file(address, rel)
        try:
            st: os.stat_result | None = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            raise NoteError(f"{quoted(rel)} is a directory; choose a file name inside it")
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise NoteError(f"note {quoted(rel)} is a symbolic link or a special file; notes never follow links: "
                            "use another path")
        existed = st is not None
        old: bytes | None = None
        if append and existed:
            try:
                old = _read_regular(path)
            except FileNotFoundError:
                old, existed = None, False
        new = (old or b"") + data if append else data
        if len(new) > self.max_bytes:
            have = len(old or b"") if append else 0
            raise NoteError(
                f"note {quoted(rel)} would be {len(new)} bytes; the limit is {self.max_bytes} UTF-8 bytes per file"
                + (f" (it has {have}; {self.max_bytes - have} left)" if append else "")
                + ". Write a shorter text or start another note.")
        if st is None:
            self._file(address, rel, create_parents=True)  # only for a write that will happen
        now = time.time()
        meta = self._meta(address, rel)
        if not existed or not meta.exists():
            created = now if st is None else st.st_mtime
            self._atomic(address, meta, orjson.dumps({"path": rel, "created_at": created}))
        self._atomic(address, path, new)
        return WriteResult(len(new), len(data), not existed)

    def _atomic(self, address: str, target: Path, data: bytes) -> None:
        tmpdir = self._private(address) / "tmp"
        tmpdir.mkdir(parents=True, exist_ok=True, mode=0o700)
        atomic_write_bytes(target, data, 0o600, tmp_dir=tmpdir, dir_mode=0o700)
