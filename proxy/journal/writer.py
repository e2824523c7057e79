"""The journal's writer thread: ops handed over without waking it, committed on its own clock.

The request path only appends to a deque (no lock shared with the writer, no notify): measured on
the proxy, waking the writer on every submit cost about 3% of a streamed turn's latency in GIL and
scheduler hand-offs, more than all the journal's own work. The writer wakes every `batch_interval`,
takes everything pending and commits it, at most `batch_size` ops per transaction (the ops of one
request or response stay together). So an op is committed at most `batch_interval` plus one commit
after it was submitted: a crash (SIGKILL) loses at most that window — `bench/bench_journal.py`
measures it. After `park_after` seconds without work the writer parks (an idle proxy wakes nobody)
and the next submit wakes it once. `flush()` returns once everything submitted before it is
committed; `close()` flushes and stops the thread.

If the database stalls and `queue_max` ops are pending, `submit` waits up to `full_wait` seconds
rather than dropping a journaled item, then drops with an error log (the proxy keeps serving).
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
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
PARK_AFTER = 2.0  # seconds without work before the writer stops ticking


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
    wakeups: int = 0  # times a submit had to wake a parked writer
    last_commit_at: float = 0.0
    latencies: list[float] = field(default_factory=list)  # enqueue→commit of each batch's oldest op


class JournalWriter:
    def __init__(self, db_path: Path, batch_size: int = BATCH_SIZE, batch_interval: float = BATCH_INTERVAL,
                 queue_max: int = QUEUE_MAX, full_wait: float = 5.0, keep_latencies: bool = False,
                 park_after: float = PARK_AFTER):
        self.db_path = db_path
        self.batch_size = batch_size
        self.batch_interval = batch_interval
        self.queue_max = queue_max
        self.full_wait = full_wait
        self.keep_latencies = keep_latencies
        self.stats = WriterStats()
        # Entries: (enqueued at, the ops submitted together) or a flush marker. deque.append/popleft are
        # atomic, so submitters and the writer share no lock.
        self._pending: deque[tuple[float, tuple[Op, ...]] | _Marker] = deque()
        self._submitted = 0  # ops appended (submitters only, under _submit_lock)
        self._taken = 0  # ops taken by the writer (writer thread only)
        self._submit_lock = threading.Lock()  # among submitters; the writer never takes it
        self._wake = threading.Event()
        self._parked = False
        self._urgent = False  # a flush/close/full queue wants the writer now, not at its next tick
        self._park_ticks = max(1, round(park_after / batch_interval)) if batch_interval > 0 else 1
        self._closed = False
        # The journal's backlog (work the request path left for later) is settled on each tick, so its
        # writes go out in the same tick; `_waiting` tells whether it holds anything.
        self._settle: Callable[[], None] | None = None
        self._waiting: Callable[[], bool] = lambda: False
        self._thread = threading.Thread(target=self._run, name="ctproxy-journal", daemon=True)
        self._thread.start()

    # ---- any thread -------------------------------------------------------------------------------

    def submit(self, op: Op) -> None:
        self.submit_many((op,))

    def submit_many(self, ops: Sequence[Op]) -> None:
        """Enqueue ops as one unit (committed in one transaction); never wakes a ticking writer."""
        if not ops:
            return
        if self._closed:
            raise RuntimeError("journal writer is closed")
        with self._submit_lock:
            if self._submitted - self._taken + len(ops) > self.queue_max and not self._wait_for_room(len(ops)):
                self.stats.dropped += len(ops)
                log.error("journal queue full for %.1fs; dropped %d ops", self.full_wait, len(ops))
                return
            self._pending.append((time.monotonic(), tuple(ops)))
            self._submitted += len(ops)
        self.wake_if_parked()

    def feed(self, settle: Callable[[], None], waiting: Callable[[], bool]) -> None:
        """Run `settle` (which submits ops) before each drain; `waiting()` says it has work."""
        self._settle, self._waiting = settle, waiting

    def wake_if_parked(self) -> None:
        """Call after adding work (here or to the fed backlog): a writer about to park re-checks both."""
        if self._parked:
            self._parked = False
            self.stats.wakeups += 1
            self._wake.set()

    def _wait_for_room(self, n: int) -> bool:
        """The database is behind: have the writer drain now, and wait (a rare, stalled path)."""
        deadline = time.monotonic() + self.full_wait
        while self._submitted - self._taken + n > self.queue_max:
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            self._nudge()
            time.sleep(0.005)
        return True

    def _nudge(self) -> None:
        self._urgent = True
        self._wake.set()

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything submitted so far is committed. False on timeout or when closed."""
        if self._closed or not self._thread.is_alive():
            return False
        marker = _Marker()
        self._pending.append(marker)
        self._nudge()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        marker = _Marker(stop=True)
        self._pending.append(marker)
        self._closed = True
        self._nudge()
        marker.done.wait(timeout)
        self._thread.join(timeout)

    @property
    def pending(self) -> int:
        """Ops submitted and not yet taken by the writer."""
        return self._submitted - self._taken

    # ---- the writer thread --------------------------------------------------------------------------

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

    def _park(self) -> None:
        """Sleep until a submit (or flush) wakes us; then give the burst one interval to gather."""
        self._parked = True
        if not self._pending and not self._waiting():  # re-checked after publishing `_parked`: work
            self._wake.wait()  # added in between is seen here, work added later wakes us
        self._parked = False
        self._wake.clear()
        if not self._urgent:
            self._wake.wait(self.batch_interval)

    def _run(self) -> None:
        conn = self._connect()
        idle = 0
        try:
            while True:
                if idle >= self._park_ticks:
                    self._park()
                    idle = 0
                else:
                    self._wake.wait(self.batch_interval)
                self._wake.clear()
                self._urgent = False
                if self._settle is not None:
                    try:
                        self._settle()
                    except Exception as exc:  # never let the journal's backlog stop the writer
                        log.error("journal: settling the backlog failed (%s)", type(exc).__name__)
                worked, stop = self._drain(conn)
                idle = 0 if worked else idle + 1
                if stop:
                    return
        finally:
            conn.close()

    def _drain(self, conn: sqlite3.Connection) -> tuple[bool, bool]:
        """Commit everything pending, in transactions of at most `batch_size` ops (whole units);
        release markers once what precedes them is committed. Returns (did work, stop)."""
        batch: list[Op] = []
        first_at = 0.0
        worked = False
        while self._pending:
            entry = self._pending.popleft()
            worked = True
            if isinstance(entry, _Marker):
                if batch:
                    self._commit(conn, batch, first_at)
                    batch = []
                entry.done.set()
                if entry.stop:
                    return True, True
                continue
            at, ops = entry
            if batch and len(batch) + len(ops) > self.batch_size:
                self._commit(conn, batch, first_at)
                batch = []
            if not batch:
                first_at = at
            batch.extend(ops)
            self._taken += len(ops)
        if batch:
            self._commit(conn, batch, first_at)
        return worked, False

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
