"""Per-path mutation queue: tools that write files hold their paths here so edits never interleave.

Every file-writing tool in the tool server (apply_patch today, others later) wraps its
read-modify-write in `hold(paths)`. Holders of disjoint path sets run concurrently; holders
that share a path run one after another in arrival order. Paths are compared after
`os.path.abspath` normalisation, so callers should pass the same spelling they will write
(the canonical workspace path joined with the relative path).

This is an in-process queue: it orders the tools of one tool-server process. It does not
lock files against other processes or editors.

    queue = shared_path_queue(services)
    async with queue.hold([target, move_destination], cancel=ctx.cancel):
        ...  # read, compute, write
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from proxy.errors import CtproxyError

EXTRAS_KEY = "path_queue"


class QueueWaitCancelled(CtproxyError):
    """The caller's cancel signal fired while it was still waiting for a path; nothing ran."""


@dataclass
class _Slot:
    lock: asyncio.Lock
    users: int = 0  # holders + waiters; the slot is dropped when it reaches zero


class PathQueue:
    def __init__(self) -> None:
        self._slots: dict[str, _Slot] = {}

    @staticmethod
    def key(path: str | os.PathLike[str]) -> str:
        return os.path.abspath(os.fspath(path))

    def busy_paths(self) -> list[str]:
        """Paths currently held or waited for (for status and tests)."""
        return sorted(self._slots)

    @contextlib.asynccontextmanager
    async def hold(
        self, paths: Iterable[str | os.PathLike[str]], cancel: asyncio.Event | None = None
    ) -> AsyncIterator[None]:
        """Hold every path in `paths` for the duration of the block.

        Locks are taken in sorted order so two holders of overlapping sets cannot deadlock.
        If `cancel` is set while waiting, the paths acquired so far are released and
        `QueueWaitCancelled` is raised: a queued call never waits on behalf of a caller that
        has given up.
        """
        keys = sorted({self.key(p) for p in paths})
        slots = [self._enter(k) for k in keys]
        acquired: list[_Slot] = []
        try:
            for slot in slots:
                await self._acquire(slot, cancel)
                acquired.append(slot)
            yield
        finally:
            for slot in reversed(acquired):
                slot.lock.release()
            for k in keys:
                self._leave(k)

    def _enter(self, key: str) -> _Slot:
        slot = self._slots.get(key)
        if slot is None:
            slot = self._slots[key] = _Slot(asyncio.Lock())
        slot.users += 1
        return slot

    def _leave(self, key: str) -> None:
        slot = self._slots[key]
        slot.users -= 1
        if slot.users == 0:
            del self._slots[key]

    @staticmethod
    async def _acquire(slot: _Slot, cancel: asyncio.Event | None) -> None:
        if cancel is None:
            await slot.lock.acquire()
            return
        if cancel.is_set():
            raise QueueWaitCancelled()
        acquire = asyncio.ensure_future(slot.lock.acquire())
        cancelled = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({acquire, cancelled}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            acquire.cancel()
            cancelled.cancel()
            await _settle_acquire(slot, acquire)
            raise
        cancelled.cancel()
        if acquire.done() and not acquire.cancelled() and not cancel.is_set():
            return
        acquire.cancel()
        await _settle_acquire(slot, acquire)
        raise QueueWaitCancelled()


async def _settle_acquire(slot: _Slot, acquire: asyncio.Future[Any]) -> None:
    """Undo an acquire that raced with cancellation: if it got the lock after all, give it back."""
    with contextlib.suppress(asyncio.CancelledError):
        await acquire
    if acquire.done() and not acquire.cancelled() and acquire.exception() is None:
        slot.lock.release()


def shared_path_queue(services: Any) -> PathQueue:
    """The one queue of a tool server, kept in `services.extras` so every family shares it."""
    extras: dict[str, Any] = services.extras
    queue = extras.get(EXTRAS_KEY)
    if queue is None:
        queue = extras[EXTRAS_KEY] = PathQueue()
    return queue

