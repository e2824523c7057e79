"""Execution output recovery (seed 004 §5.9): the full decoded output of every stream.

Each stream keeps an in-memory prefix (256 KiB); past it, or when a path must be published,
the prefix and everything after it go to a private file. Files live in one lazily created
folder per tool-server session (0700), are created exclusively with UUID names (0600),
are written from a worker thread in batches, and are removed at shutdown only if they are
still the files we created. The producer is paused while too much is pending, so a slow disk
slows the command instead of growing memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import tempfile
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from tools_server.shell import limits

log = logging.getLogger(__name__)

CaptureState = Literal["capturing", "complete", "partial", "unavailable"]
CaptureReason = Literal["io-error", "io-timeout", "overload", "source-error", "missing", "owner-closed"]

_BATCH_BYTES = 1024 * 1024


class CaptureStore:
    """The private capture folder of one tool-server session and the files it created."""

    def __init__(self, parent: Callable[[], Path]) -> None:
        self._parent = parent
        self._dir: Path | None = None
        self._files: dict[Path, tuple[int, int]] = {}
        self.closed = False

    @property
    def directory(self) -> Path | None:
        return self._dir

    def create_file(self, label: str) -> tuple[Path, int]:
        """Blocking (run in a thread): exclusive create of a new 0600 file."""
        if self.closed:
            raise OSError("capture store is closed")
        if self._dir is None:
            self._dir = Path(tempfile.mkdtemp(prefix="shell-", dir=self._parent()))
        path = self._dir / f"{uuid.uuid4().hex}-{label}.txt"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(path, flags, 0o600)
        st = os.fstat(fd)
        self._files[path] = (st.st_dev, st.st_ino)
        return path, fd

    def identity_ok(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and self._files.get(path) == (st.st_dev, st.st_ino)

    def cleanup(self, keep: set[Path] | None = None) -> int:
        """Blocking: remove our own files (identity-checked, not recursive). Returns the count."""
        self.closed = True
        removed = 0
        for path in list(self._files):
            if keep and path in keep:
                continue
            if self.identity_ok(path):
                with contextlib.suppress(OSError):
                    os.unlink(path)
                    removed += 1
            self._files.pop(path, None)
        if self._dir is not None and not self._files:
            with contextlib.suppress(OSError):
                os.rmdir(self._dir)  # fails, as it should, if anyone else put something there
        return removed


def save_text(store: CaptureStore, label: str, text: str) -> dict[str, Any]:
    """Blocking (run in a thread): one whole text (a code cell's result or error past its preview) in a
    new private file of the store; its recovery snapshot (`unavailable` with the reason if it failed)."""
    data = text.encode("utf-8", "replace")
    try:
        path, fd = store.create_file(label)
    except OSError:
        return {"state": "unavailable", "bytes": len(data), "capturedBytes": 0, "reason": "io-error"}
    try:
        _write_all(fd, data)
    except OSError:
        return {"state": "partial", "path": str(path), "bytes": len(data), "capturedBytes": 0, "reason": "io-error"}
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    return {"state": "complete", "path": str(path), "bytes": len(data), "capturedBytes": len(data)}


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _close_late(fut: asyncio.Future[Any], fd: int | None) -> None:
    result = None if fut.cancelled() or fut.exception() is not None else fut.result()
    if fd is None and isinstance(result, tuple):
        fd = result[1]  # a create that finished after its timeout
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)


class StreamCapture:
    """The capture of one stream of one job."""

    def __init__(self, store: CaptureStore, label: str, on_room: Callable[[], None],
                 prefix_budget: int = limits.CAPTURE_PREFIX_BYTES,
                 io_timeout: float = limits.CAPTURE_IO_TIMEOUT_S) -> None:
        self._store = store
        self._label = label
        self._on_room = on_room
        self._prefix_budget = prefix_budget
        self._io_timeout = io_timeout
        self._memory: bytearray | None = bytearray()
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._wakeup = asyncio.Event()
        self._opened = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._fd: int | None = None
        self._inflight: asyncio.Future[Any] | None = None
        self.path: Path | None = None
        self.bytes = 0  # decoded UTF-8 bytes the stream produced
        self.captured = 0  # bytes confirmed written to the file
        self.source_closed = False
        self.source_error = False
        self.fault: CaptureReason | None = None
        self.open_failed = False
        self.lost = False  # the producer dropped text before it reached the capture (code mode's credit)

    # -- producer side (called from protocol callbacks, never blocks) --------------------------
    def feed(self, data: bytes) -> None:
        if not data:
            return
        self.bytes += len(data)
        if self.fault is not None:
            return
        if self._memory is not None:
            self._memory += data
            if len(self._memory) > self._prefix_budget:
                self.spill()
            return
        self._pending.append(data)
        self._pending_bytes += len(data)
        self._wakeup.set()

    def over_limit(self) -> bool:
        return (len(self._pending) > limits.CAPTURE_MAX_PENDING_CHUNKS
                or self._pending_bytes > limits.CAPTURE_MAX_PENDING_BYTES)

    def note_loss(self) -> None:
        """The producer could not hand over some of its text (a code cell past its output credit): the
        file says where, and the capture is `partial` (`overload`) however well the writes went."""
        self.lost = True

    def close_source(self, error: bool = False) -> None:
        self.source_closed = True
        self.source_error = self.source_error or error
        self._wakeup.set()

    # -- file lifecycle ------------------------------------------------------------------------
    @property
    def in_memory(self) -> bool:
        return self._memory is not None and self.fault is None

    def spill(self) -> None:
        """Move the prefix to a file and write everything after it there too."""
        if self._memory is None or self.fault is not None:
            return
        if self._memory:
            self._pending.append(bytes(self._memory))
            self._pending_bytes += len(self._memory)
        self._memory = None
        self._writer = asyncio.get_running_loop().create_task(self._run(), name=f"capture-{self._label}")

    async def ensure_file(self) -> None:
        """Publish a stable path (even with no output yet)."""
        self.spill()
        if self._writer is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._opened.wait(), self._io_timeout)
            if not self._opened.is_set() and self.fault is None:
                self.fault = "io-timeout"

    async def settle(self) -> None:
        """Wait until the writer finished (the source must be closed for that)."""
        if self._writer is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(self._writer), self._io_timeout + 1)

    def abort(self, reason: CaptureReason) -> None:
        if self._writer is not None and not self._writer.done():
            if self.fault is None:
                self.fault = reason
            self._writer.cancel()
        self._drop_pending()

    async def _run(self) -> None:
        try:
            try:
                self.path, self._fd = await self._io(self._store.create_file, self._label)
            except (OSError, TimeoutError):
                self.open_failed = True
                raise
            finally:
                self._opened.set()
            while True:
                if not self._pending:
                    if self.source_closed:
                        break
                    self._wakeup.clear()
                    await self._wakeup.wait()
                    continue
                batch = self._take_batch()
                await self._io(_write_all, self._fd, batch)
                self.captured += len(batch)
                self._pending_bytes -= len(batch)
                if not self.over_limit():
                    self._on_room()
        except TimeoutError:
            self.fault = self.fault or "io-timeout"
        except OSError:
            self.fault = self.fault or "io-error"
        except asyncio.CancelledError:
            self.fault = self.fault or "owner-closed"
        finally:
            self._drop_pending()
            self._release_fd()
            self._on_room()

    def _release_fd(self) -> None:
        fd, self._fd = self._fd, None
        inflight = self._inflight
        if inflight is not None and not inflight.done():
            # a worker thread still runs (timeout or cancel): it owns the late cleanup
            inflight.add_done_callback(lambda fut: _close_late(fut, fd))
        elif fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _take_batch(self) -> bytes:
        parts = []
        size = 0
        while self._pending and size < _BATCH_BYTES:
            chunk = self._pending.popleft()
            parts.append(chunk)
            size += len(chunk)
        # the byte count stays pending until the write is confirmed
        return b"".join(parts)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._inflight = asyncio.ensure_future(asyncio.to_thread(fn, *args))
        return await asyncio.wait_for(asyncio.shield(self._inflight), self._io_timeout)

    def _drop_pending(self) -> None:
        if self._pending:
            self._pending.clear()
            self._pending_bytes = 0

    # -- what results report -------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any] | None:
        """`{state, path?, bytes, capturedBytes, reason?}`; None while no file was needed."""
        if self._memory is not None and self.fault is None:
            return None
        snap: dict[str, Any] = {"bytes": self.bytes, "capturedBytes": self.captured}
        if self.path is not None:
            snap["path"] = str(self.path)
        state: CaptureState
        reason: CaptureReason | None = self.fault
        if self.path is None:
            state = "unavailable"
            reason = reason or "io-error"
        elif not self._store.identity_ok(self.path):
            state, reason = "unavailable", "missing"
        elif reason is not None:
            state = "partial"
        elif self.lost:
            state, reason = "partial", "overload"
        elif self.source_closed and self._writer is not None and self._writer.done():
            if self.source_error:
                state, reason = "partial", "source-error"
            else:
                state = "complete" if self.captured == self.bytes else "partial"
        else:
            state = "capturing"
        snap["state"] = state
        if reason is not None:
            snap["reason"] = reason
        return snap
