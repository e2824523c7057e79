"""One background thread with its own SQLite connection, so database work never blocks the event loop.

Small last-value-wins writes (a session's usage, what a request forwarded) go through `put_latest`:
they are coalesced by key and committed together, in one transaction, `batch_interval` after the first
of them. Measured, one autocommit write and one thread hand-off per request cost more CPU than the rest
of the chain's work on a small request; batched, a burst of requests pays for one. Program order is
kept: `submit` and `run` take the pending writes with them, so anything enqueued later sees them applied.
Another process (the tool server) sees such a write at most about `batch_interval` late — the same
window as the journal's (proxy/journal/writer.py); `close` commits whatever is pending.

The chain's addons share one worker per runtime (`shared`), so the proxy runs one database thread for
this state instead of one per addon. Callers are on one thread (mitmproxy's event loop; stream callables
run there too): the pending writes are only ever touched there, so they need no lock — measured, a lock
shared with the worker thread cost ≈90 µs per write in GIL hand-offs.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from proxy.db import connect

T = TypeVar("T")
Write = Callable[[sqlite3.Connection], object]

log = logging.getLogger("ctproxy.db")
BATCH_INTERVAL = 0.02


class DBWorker:
    def __init__(self, path: Path, batch_interval: float = BATCH_INTERVAL):
        self.path = path
        self.batch_interval = batch_interval
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctproxy-db")
        self._conn: sqlite3.Connection | None = None
        self._pending: dict[Hashable, Write] = {}
        self._last: Future[Any] | None = None  # the last job handed to the thread (jobs run in order)
        self._closed = False

    # ---- in the worker thread -----------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.path)
        return self._conn

    def _apply(self, writes: list[Write], fn: Callable[[sqlite3.Connection], T] | None) -> T | None:
        conn = self._connection()
        if writes:
            try:
                conn.execute("BEGIN IMMEDIATE")
                for write in writes:
                    write(conn)
                conn.execute("COMMIT")
            except Exception as exc:  # state writes are best effort: never take the caller's job down
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                log.error("db: %d coalesced writes failed (%s)", len(writes), type(exc).__name__)
        return fn(conn) if fn is not None else None

    # ---- from any thread ----------------------------------------------------------------------------

    def _take_pending(self) -> list[Write]:
        if not self._pending:
            return []
        writes = list(self._pending.values())
        self._pending.clear()
        return writes

    def put_latest(self, key: Hashable, write: Write) -> None:
        """Commit `write` soon, in a batch; a newer write with the same key replaces a pending older one."""
        if self._closed:
            raise RuntimeError("database worker is closed")
        first = not self._pending
        self._pending.pop(key, None)  # re-insert: the batch keeps the order of the latest writes
        self._pending[key] = write
        if first:
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a script, a test): no one to wait for, write now
            self._flush_pending()
            return
        loop.call_later(self.batch_interval, self._flush_pending)

    def _flush_pending(self) -> None:
        writes = self._take_pending()
        if writes:
            self._last = self._pool.submit(self._apply, writes, None)

    def flush_now(self) -> None:
        """Hand the pending writes to the thread now rather than `batch_interval` later, when it is idle: a caller
        about to wait for them (an answer whose end waits for its usage, `settled`) starts their commit early.
        While the thread is busy they stay pending and go with the next job, so a burst of answers ending
        together still shares one commit."""
        last = self._last
        if last is None or last.done():
            self._flush_pending()

    def settled(self) -> Awaitable[None] | None:
        """None when every write put so far is committed (none pending, the thread's last job done): nothing to
        wait for, not even a hand-off to the thread. Else an awaitable done once they are."""
        if self._pending:  # taken now: an answer ending in the same loop turn waits for this job, not a new one
            self._last = self._pool.submit(self._apply, self._take_pending(), None)
        last = self._last
        if last is None or last.done():
            return None
        return _finished(last)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        job = self._last = self._pool.submit(self._apply, self._take_pending(), fn)
        return await asyncio.wrap_future(job)  # type: ignore[return-value]

    def submit(self, fn: Callable[[sqlite3.Connection], Any]) -> None:
        """Fire and forget (errors are swallowed by the future; use `run` to observe them)."""
        self._last = self._pool.submit(self._apply, self._take_pending(), fn)

    def close(self) -> None:
        """Commit what is pending, close the connection, stop the thread."""
        self._closed = True
        writes = self._take_pending()

        def _close() -> None:
            if writes:
                self._apply(writes, None)
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        self._pool.submit(_close)
        self._pool.shutdown(wait=True)


async def _finished(job: Future[Any]) -> None:
    """Wait for a job of the thread: its writes are committed when it is done (its own result is not ours)."""
    try:
        await asyncio.wrap_future(job)
    except Exception:  # a job's reader failed: its caller sees that; the writes before it were applied
        pass


def shared(services: Any, path: Path) -> DBWorker:
    """The runtime's one state worker (`Runtime.services.db`), created on first use."""
    worker = services.db
    if worker is None:
        worker = services.db = DBWorker(path)
    return worker


def close_shared(services: Any) -> None:
    """Every addon that used the shared worker calls this when done; the first call closes it."""
    worker, services.db = services.db, None
    if worker is not None:
        worker.close()
