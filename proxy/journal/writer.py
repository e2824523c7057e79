"""The journal's writer thread: a bounded queue drained in batches, one transaction per batch.

The request path only enqueues: the ops of one request (or response) go in as one queue entry.
A batch commits when it holds `batch_size` operations (the entry that crosses the size stays whole)
or `batch_interval` seconds after its first operation, whichever comes first, so a crash (SIGKILL)
loses at most the operations enqueued during the last `batch_interval` plus one commit — the bench
(`bench/bench_journal.py`) measures that window. `flush()` returns once everything enqueued before
it is committed; `close()` flushes and stops the thread.

If the queue is full (the database is stalled), `submit` waits up to `full_wait` seconds rather
than dropping a journaled item, then drops with an error log (the proxy keeps serving).
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proxy.db import connect
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.ops import Op
from proxy.journal.store import apply_batch

log = logging.getLogger("ctproxy.journal")

BATCH_SIZE = 512
BATCH_INTERVAL = 0.02
QUEUE_MAX = 100_000


def _yield_gil() -> None:
    time.sleep(0)


@dataclass
class _Marker:
    done: threading.Event = field(default_factory=threading.Event)
    stop: bool = False


@dataclass
class WriterStats:
    batches: int = 0
    ops: int = 0
    dropped: int = 0
    failed_batches: int = 0
    max_batch: int = 0
    last_commit_at: float = 0.0
    latencies: list[float] = field(default_factory=list)  # enqueue→commit of each batch's oldest op


class JournalWriter:
    def __init__(self, db_path: Path, batch_size: int = BATCH_SIZE, batch_interval: float = BATCH_INTERVAL,
                 queue_max: int = QUEUE_MAX, full_wait: float = 5.0, keep_latencies: bool = False):
        self.db_path = db_path
        self.batch_size = batch_size
        self.batch_interval = batch_interval
        self.full_wait = full_wait
        self.keep_latencies = keep_latencies
        self.stats = WriterStats()
        # Entries are tuples of ops enqueued together (one request's or response's), or a flush marker.
        self._q: queue.Queue[tuple[float, tuple[Op, ...] | _Marker]] = queue.Queue(maxsize=queue_max)
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="ctproxy-journal", daemon=True)
        self._thread.start()

    def submit(self, op: Op) -> None:
        self.submit_many((op,))

    def submit_many(self, ops: Sequence[Op]) -> None:
        """Enqueue ops as one unit (one lock round trip, however many ops)."""
        if not ops:
            return
        if self._closed:
            raise RuntimeError("journal writer is closed")
        try:
            self._q.put((time.monotonic(), tuple(ops)), timeout=self.full_wait)
        except queue.Full:
            self.stats.dropped += len(ops)
            log.error("journal queue full for %.1fs; dropped %d ops", self.full_wait, len(ops))

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything submitted so far is committed. False on timeout or when closed."""
        if self._closed or not self._thread.is_alive():
            return False
        marker = _Marker()
        self._q.put((time.monotonic(), marker))
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        marker = _Marker(stop=True)
        self._q.put((time.monotonic(), marker))
        self._closed = True
        marker.done.wait(timeout)
        self._thread.join(timeout)

    @property
    def pending(self) -> int:
        return self._q.qsize()

    def _connect(self) -> sqlite3.Connection:
        """Open the writer's connection; another process switching the database to WAL or applying its
        schema at the same moment can make this fail briefly, so retry rather than let the thread die."""
        delay = 0.05
        while True:
            try:
                return connect(self.db_path)
            except sqlite3.OperationalError as exc:
                log.warning("journal: opening the database failed (%s); retrying", type(exc).__name__)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                first_at, first = self._q.get()
                batch: list[Op] = []
                markers: list[_Marker] = []
                if isinstance(first, _Marker):
                    markers.append(first)
                else:
                    batch.extend(first)
                deadline = time.monotonic() + self.batch_interval
                while not markers and len(batch) < self.batch_size:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        break
                    try:
                        _, nxt = self._q.get(timeout=remaining)
                    except queue.Empty:
                        break
                    if isinstance(nxt, _Marker):
                        markers.append(nxt)
                    else:
                        batch.extend(nxt)
                if batch:
                    self._commit(conn, batch, first_at)
                stop = False
                for m in markers:
                    m.done.set()
                    stop = stop or m.stop
                if stop:
                    return
        finally:
            conn.close()

    def _commit(self, conn: sqlite3.Connection, batch: list[Op], first_at: float) -> None:
        for attempt in range(3):
            try:
                # Yield the GIL after every op: the proxy's event loop never waits behind a whole batch.
                apply_batch(conn, batch, between=_yield_gil)
                break
            except Exception as exc:  # a stalled or broken database must not kill the writer
                log.error("journal batch of %d ops failed (%s), attempt %d", len(batch), type(exc).__name__,
                          attempt + 1)
                time.sleep(0.1 * (attempt + 1))
        else:
            self.stats.failed_batches += 1
            return
        now = time.monotonic()
        self.stats.batches += 1
        self.stats.ops += len(batch)
        self.stats.max_batch = max(self.stats.max_batch, len(batch))
        self.stats.last_commit_at = now
        if self.keep_latencies:
            self.stats.latencies.append(now - first_at)
