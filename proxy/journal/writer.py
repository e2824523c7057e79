"""The journal's writer thread: ops handed over without a wake-up per op, committed in batches.

The writer sleeps until rung, and nothing on the proxy's request path rings it during an exchange:
work handed over from an event loop is taken by a loop timer `batch_interval` later (the journal
schedules it, see journal.py), so the writer wakes about once per interval of activity and never
while a request is being forwarded. Measured on the proxy, waking it for every submit cost about 3%
of a streamed turn's latency in GIL and scheduler hand-offs, and on this VM every timed wake-up
costs 50-120 µs of CPU, so an idle writer does not tick. Work handed over from a thread without a
loop wakes a sleeping writer, which then gathers for one interval before committing.

A drain commits everything pending, at most `batch_size` ops per transaction (the ops of one request
or answer stay together). An op is committed at most `batch_interval` plus one commit after it was
handed over: a crash (SIGKILL) loses at most that window — `bench/bench_journal.py` measures it.
`flush()` returns once everything submitted before it is committed; `close()` flushes and stops the
thread. If the database stalls and `queue_max` ops are pending, `submit` waits up to `full_wait`
seconds rather than dropping a journaled item, then drops with an error log (the proxy keeps serving).
"""

from __future__ import annotations

import _thread
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from proxy import memory
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.ops import Op

log = logging.getLogger("ctproxy.journal")

BATCH_SIZE = 512
BATCH_INTERVAL = 0.02
QUEUE_MAX = 100_000
INDEX_ITEMS = 256  # the full-text index takes items in bulk: this many …
BIG_DRAIN_OPS = 10_000  # after taking this many ops since the last trim, the C heap is trimmed (proxy/memory.py)
BIG_WRITE_ITEMS = 10_000  # after writing or indexing this many items, the connection's caches are freed once idle
INDEX_DELAY = 2.0  # … or this many seconds after the first one not indexed yet


class JournalBackendLike(Protocol):
    """What the writer needs of the journal's backend (the whole of it: proxy/store/interface.JournalBackend)."""

    indexes_text: bool

    def apply(self, ops: Sequence[Op], stamp: str | None = None) -> int: ...

    def index_text(self) -> int: ...

    def close_writer(self) -> None: ...

    def release_memory(self) -> None: ...


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
    wakeups: int = 0  # times the writer was rung or woken
    drains: int = 0  # times it woke and drained (an idle writer does not)
    indexed: int = 0  # items added to the full-text index
    index_runs: int = 0
    memory_releases: int = 0  # times the backend freed its caches after big work
    last_commit_at: float = 0.0
    latencies: list[float] = field(default_factory=list)  # enqueue→commit of each batch's oldest op


class JournalWriter:
    def __init__(self, target: Path | JournalBackendLike, batch_size: int = BATCH_SIZE,
                 batch_interval: float = BATCH_INTERVAL,
                 queue_max: int = QUEUE_MAX, full_wait: float = 5.0, keep_latencies: bool = False,
                 index_items: int = INDEX_ITEMS, index_delay: float = INDEX_DELAY, stamp: str | None = None):
        if isinstance(target, Path):
            from proxy.journal.sqlite_backend import SqliteJournal

            target = SqliteJournal(target)
        # Where the batches go: the process's store's journal (proxy/store/interface.py), each batch one
        # transaction on the writer thread's own connection.
        self.backend = target
        self.stamp = stamp  # shared sessions: this writer's id on the sessions it changes (store.BatchContext)
        self.index_items = index_items
        self.index_delay = index_delay
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
        self._trim_mark = 0  # `_taken` when the last trim was asked for
        self._submit_lock = threading.Lock()  # among submitters; the writer never takes it
        # A raw lock as a bell: held by the writer while it sleeps on it, released by whoever rings
        # (one C call each side; a threading.Event costs twice the CPU per wake-up).
        self._bell = _thread.allocate_lock()
        self._bell.acquire()
        self._parked = False  # sleeping until rung (nothing pending)
        self._now = False  # the ring wants a drain now (a timer, flush, close, full queue), not a gather
        self._closed = False
        self._unindexed = 0  # items committed by this writer and not in the full-text index yet
        self._unindexed_since = 0.0
        self._written = 0  # items inserted or indexed since the backend last released its memory
        # The journal's backlog (work the request path left for later) is settled before each drain, so its
        # writes go out in the same drain; `_waiting` tells whether it holds anything.
        self._settle: Callable[[], None] | None = None
        self._waiting: Callable[[], bool] = lambda: False
        self._thread = threading.Thread(target=self._run, name="ctproxy-journal", daemon=True)
        self._thread.start()

    # ---- any thread -------------------------------------------------------------------------------

    def submit(self, op: Op) -> None:
        self.submit_many((op,))

    def submit_many(self, ops: Sequence[Op], since: float | None = None) -> None:
        """Enqueue ops as one unit (committed in one transaction); wakes the writer only if it sleeps. `since`
        (time.monotonic) is when the request path handed over what they record, if earlier than now."""
        if not ops:
            return
        if self._closed:
            raise RuntimeError("journal writer is closed")
        with self._submit_lock:
            # The writer thread itself (settling the journal's backlog) drains right after: never wait on it.
            full = self._submitted - self._taken + len(ops) > self.queue_max
            if full and threading.get_ident() != self._thread.ident and not self._wait_for_room(len(ops)):
                self.stats.dropped += len(ops)
                log.error("journal queue full for %.1fs; dropped %d ops", self.full_wait, len(ops))
                return
            self._pending.append((time.monotonic() if since is None else since, tuple(ops)))
            self._submitted += len(ops)
        self.wake_if_parked()

    def feed(self, settle: Callable[[], None], waiting: Callable[[], bool]) -> None:
        """Run `settle` (which submits ops) before each drain; `waiting()` says it has work."""
        self._settle, self._waiting = settle, waiting

    def wake_if_parked(self) -> None:
        """Call after adding work (here or to the fed backlog): a sleeping writer wakes, gathers for one
        interval, and drains. (A writer about to sleep re-checks both after publishing `_parked`.)"""
        if self._parked:
            self._parked = False
            self._release()

    def ring(self) -> None:
        """Drain now: what is pending, and the journal's backlog."""
        self._now = True
        self._release()

    def _release(self) -> None:
        self.stats.wakeups += 1
        try:
            self._bell.release()
        except RuntimeError:
            pass  # already rung

    def _wait_for_room(self, n: int) -> bool:
        """The database is behind: have the writer drain now, and wait (a rare, stalled path)."""
        deadline = time.monotonic() + self.full_wait
        # A unit bigger than the whole queue (one request of more items than `queue_max`) goes in once the
        # queue is empty: waiting for room it can never have would drop every item of it.
        while self._submitted - self._taken + n > self.queue_max and self._submitted > self._taken:
            if time.monotonic() >= deadline or not self._thread.is_alive():
                return False
            self.ring()
            time.sleep(0.005)
        return True

    def barrier(self) -> threading.Event:
        """An event that is set once everything submitted so far is committed; neither waits nor wakes the
        writer (its next drain, rung as usual by the next hand-over, passes it)."""
        marker = _Marker()
        self._pending.append(marker)
        return marker.done

    def flush(self, timeout: float | None = 30.0) -> bool:
        """Wait until everything submitted so far is committed. False on timeout or when closed."""
        if self._closed or not self._thread.is_alive():
            return False
        marker = _Marker()
        self._pending.append(marker)
        self.ring()
        return marker.done.wait(timeout)

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        marker = _Marker(stop=True)
        self._pending.append(marker)
        self._closed = True
        self.ring()
        marker.done.wait(timeout)
        self._thread.join(timeout)

    @property
    def pending(self) -> int:
        """Ops submitted and not yet taken by the writer."""
        return self._submitted - self._taken

    # ---- the writer thread --------------------------------------------------------------------------

    def _sleep(self) -> None:
        """Until there is something to do: pending work is drained within one interval; with none, sleep
        until rung (then, unless the ring wants it now, gather for one interval) or until the text
        index is due."""
        if not self._now:
            self._parked = True
            if self._pending or self._waiting():  # re-checked after publishing `_parked` (see above)
                self._parked = False
                self._bell.acquire(timeout=self.batch_interval)
            else:
                due = self._index_due_in()
                rung = self._bell.acquire() if due is None else self._bell.acquire(timeout=max(due, 0.001))
                self._parked = False
                if rung and not self._now:
                    self._bell.acquire(timeout=self.batch_interval)
        self._now = False

    def _index_due_in(self) -> float | None:
        if not self._unindexed:
            return None
        return self._unindexed_since + self.index_delay - time.monotonic()

    def _index(self, force: bool = False) -> None:
        """Bring the full-text index up to date once enough items (or old enough ones) wait for it."""
        if not self.backend.indexes_text:
            self._unindexed = 0
            return
        due = self._index_due_in()
        if due is None or not (force or due <= 0 or self._unindexed >= self.index_items):
            return
        for attempt in range(3):
            try:
                indexed = self.backend.index_text()
                self.stats.indexed += indexed
                self._written += indexed
                self.stats.index_runs += 1
                break
            except Exception as exc:  # search scans what is not indexed: a failure here loses nothing
                log.error("journal: full-text indexing failed (%s), attempt %d", type(exc).__name__, attempt + 1)
                time.sleep(0.1 * (attempt + 1))
        self._unindexed = 0

    def _release_if_big(self) -> None:
        """After big work, once nothing is pending and the text index has caught up: the backend frees its
        caches, and a trim is asked for (what was freed goes back to the OS)."""
        if self._written < BIG_WRITE_ITEMS or self._pending or self._unindexed:
            return
        self._written = 0
        try:
            self.backend.release_memory()
        except Exception as exc:  # housekeeping: never stop the writer
            log.error("journal: releasing the writer's memory failed (%s)", type(exc).__name__)
            return
        self.stats.memory_releases += 1
        memory.note_big_work(memory.BIG_BYTES)

    def _run(self) -> None:
        self._unindexed, self._unindexed_since = 1, 0.0  # whatever a crashed process left: index it now
        self._index(force=True)
        try:
            while True:
                self._sleep()
                if self._settle is not None:
                    try:
                        self._settle()
                    except Exception as exc:  # never let the journal's backlog stop the writer
                        log.error("journal: settling the backlog failed (%s)", type(exc).__name__)
                stop = self._drain()
                self._index(force=stop)
                if stop:
                    return
                self._release_if_big()
        finally:
            self.backend.close_writer()

    def _drain(self) -> bool:
        """Commit everything pending, in transactions of at most `batch_size` ops (whole units);
        release markers once what precedes them is committed. True when told to stop.

        A marker does not end the transaction it falls in: it is released with the next commit, which takes
        what follows it too. Every new session leaves one (its registration's barrier), and a burst of them
        (bench_proxy d: 50 streams at once) was committed as one transaction per session, each writing its own
        pages to the WAL, where one transaction writes the pages they share once."""
        self.stats.drains += 1
        batch: list[Op] = []
        first_at = 0.0
        released: list[threading.Event] = []  # markers whose ops are in `batch` (or committed already)
        while self._pending:
            entry = self._pending.popleft()
            if isinstance(entry, _Marker):
                if not entry.stop:
                    released.append(entry.done)
                    continue
                if batch:
                    self._commit(batch, first_at)
                for done in released:
                    done.set()
                entry.done.set()
                return True
            at, ops = entry
            if batch and len(batch) + len(ops) > self.batch_size:
                self._commit(batch, first_at)
                batch = []
                for done in released:
                    done.set()
                released.clear()
            if not batch:
                first_at = at
            batch.extend(ops)
            self._taken += len(ops)
        if batch:
            self._commit(batch, first_at)
        for done in released:
            done.set()
        if self._taken - self._trim_mark >= BIG_DRAIN_OPS:
            self._trim_mark = self._taken
            memory.note_big_work(memory.BIG_BYTES)  # a big drain's ops are garbage now: hand the pages back
        return False

    def _commit(self, batch: list[Op], first_at: float) -> None:
        for attempt in range(3):
            try:
                # No sleep(0) between ops: every statement releases the GIL while SQLite works, so the
                # event loop waits at most one op's Python; yielding cost ≈7 µs CPU and a syscall per op.
                inserted = self.backend.apply(batch, self.stamp)
                break
            except Exception as exc:  # a stalled or broken database must not kill the writer
                log.error("journal batch of %d ops failed (%s), attempt %d", len(batch), type(exc).__name__,
                          attempt + 1)
                time.sleep(0.1 * (attempt + 1))
        else:
            self.stats.failed_batches += 1
            return
        now = time.monotonic()
        if inserted and not self._unindexed:
            self._unindexed_since = now
        self._unindexed += inserted
        self._written += inserted
        self.stats.batches += 1
        self.stats.ops += len(batch)
        self.stats.max_batch = max(self.stats.max_batch, len(batch))
        self.stats.last_commit_at = now
        if self.keep_latencies:
            self.stats.latencies.append(now - first_at)
