"""The journal: tasks, agents, sessions, windows and items of every Responses exchange.

One `Journal` per proxy process (kept in the runtime's `services.journal`). Its request/answer path
(`begin_request`, `end_response`, `settle`, `ingest_request`, `ingest_response`) is ingest.py's
`JournalIngest`, a base of `Journal`: the request path only snapshots what passed and appends it to a
backlog (backlog.py), aligned with the cached branch and handed to the writer thread later. Here: the
sessions and their caches (a session seen for the first time in this process is loaded from the
database once), the windows, and the reads.

Windows API for the context/compaction work (see docs/history.md):
`current_window`, `window_of`, `start_window`, `windows`, `item_ids_for_session`, `chain_head`,
`branch_position`, `alias_response`, `session_for_response`, `record_event`.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from proxy import memory, workerid
from proxy.items.answers import ANSWERED_CALL_TYPES
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.backlog import Pending
from proxy.journal.branch import (
    Branch,
    Entry,
    Resend,
)
from proxy.journal.identity import new_task_id, resolve_identity
from proxy.journal.ingest import CACHED_ALIASES, JournalIngest, common_prefix
from proxy.journal.model import SessionState, Strategy, Window, window_id
from proxy.journal.ops import (
    EnsureAgent,
    EnsureSession,
    EnsureTask,
    FileItems,
    Op,
    PutAlias,
    PutEvent,
    PutWindow,
)
from proxy.journal.sqlite_backend import SqliteJournal
from proxy.journal.sqlite_backend import connect_retrying as connect_retrying  # (re-exported)
from proxy.journal.sqlite_backend import window_from_row as window_from_row  # (re-exported)
from proxy.journal.writer import JournalBackendLike, JournalWriter
from proxy.session import SessionIdentity
from proxy.state import StateDir

log = logging.getLogger("ctproxy.journal")

CACHED_SESSIONS = 512
DEFAULT_CACHE_BYTES = 128 << 20  # config history.cache_mb: what the cached sessions and resends may hold
# What one cached branch position costs in memory (its item id's string and the Branch's columns: list slots, the
# digest, the fingerprint, the type's slot): measured with tracemalloc on 100k-item sessions, ≈92 bytes from a big
# input's view and up to ≈124 from entries; rounded up. (As an Entry with its strings and ints: ≈310.)
ENTRY_BYTES = 128
CACHED_KNOWN = 20_000  # task ids and (task, agent) pairs known to exist
CACHED_RESENDS = 64  # sessions whose last input is kept for the byte-prefix fast path
# A session this long is let go from the caches once nothing used it for IDLE_RELEASE_SECONDS (issue 32, point 4):
# its branch positions and last input cost ≈40 MB per 100,000 items, and a process that served a few such sessions
# kept that for good (up to history.cache_mb). The next request of a released session reads it back once.
BIG_SESSION_ENTRIES = 10_000
IDLE_RELEASE_SECONDS = 30.0


class BoundedSet[T]:
    """A set that forgets its least recently added members beyond `capacity` (for caches of facts)."""

    def __init__(self, capacity: int):
        self._items: OrderedDict[T, None] = OrderedDict()
        self._capacity = capacity

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: T) -> None:
        self._items[item] = None
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)


class OrdinalCache:
    """(task, agent) → the highest window ordinal this process opened or read, bounded like the other caches (one
    entry a task: without a bound, every conversation an agent opened without a task header stayed for good).

    An entry let go may name a window the writer has not committed yet; reading the database back then would give
    an older ordinal, and the next window a taken id. So it waits aside, with a writer barrier, until that commit
    (the journal's `_dropped` sessions do the same), and a lookup meanwhile takes it back."""

    def __init__(self, capacity: int, barrier: Callable[[], threading.Event]):
        self._live: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._aside: OrderedDict[tuple[str, str], tuple[int, threading.Event]] = OrderedDict()
        self._capacity = capacity
        self._barrier = barrier

    def __len__(self) -> int:
        return len(self._live) + len(self._aside)

    def get(self, key: tuple[str, str]) -> int | None:
        value = self._live.get(key)
        if value is not None:
            self._live.move_to_end(key)
            return value
        aside = self._aside.pop(key, None)
        if aside is None:
            return None
        self.set(key, aside[0])
        return aside[0]

    def set(self, key: tuple[str, str], value: int) -> None:
        self._live[key] = value
        self._live.move_to_end(key)
        if len(self._live) > self._capacity:
            old, ordinal = self._live.popitem(last=False)
            self._aside[old] = (ordinal, self._barrier())
        while self._aside and next(iter(self._aside.values()))[1].is_set():  # barriers pass in order
            self._aside.popitem(last=False)


class AliasView(Mapping[str, str]):
    """response id → session key, for `resolve_session(..., response_aliases)`."""

    def __init__(self, journal: Journal):
        self._j = journal

    def __getitem__(self, key: str) -> str:
        found = self._j.session_for_response(key)
        if found is None:
            raise KeyError(key)
        return found

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._j.session_for_response(key) is not None

    def lookup(self, keys: Sequence[str]) -> dict[str, str]:
        """Several keys at once, those found, in one query for those this process does not know. Keys in order of
        precedence: when this process knows the first, it answers alone (the caller needs nothing after it)."""
        if keys and (hit := self._j._aliases.get(keys[0])) is not None:
            return {keys[0]: hit}
        return self._j.sessions_for_responses(keys)

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._j._aliases))

    def __len__(self) -> int:
        return len(self._j._aliases)


class Journal(JournalIngest):
    def __init__(self, state: StateDir, writer: JournalWriter | None = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, shared: bool | None = None,
                 big_entries: int = BIG_SESSION_ENTRIES, release_after: float = IDLE_RELEASE_SECONDS,
                 backend: JournalBackendLike | None = None):
        self.state = state
        # Where the journal lives (proxy/store/interface.py's JournalBackend): the process's store's, or the
        # embedded one of `state` (SQLite, the default).
        self._owns_backend = backend is None
        self.backend: JournalBackendLike = backend if backend is not None else SqliteJournal(state.db_path)
        self.big_entries = big_entries
        self.release_after = release_after
        self._release_timer: threading.Timer | None = None
        self.released = 0  # big sessions let go while idle (tests, debugging)
        self.cache_bytes = cache_bytes  # the caches are bounded in bytes too, not only by count (issue 10.3)
        self.backend.open()  # first: applies the schema (and an older state's migration) before the writer starts
        # `ctproxy up --workers N`: other processes journal the same sessions. Each writer stamps the sessions
        # it changes, and a session cached here is checked against its stamp before a request uses it.
        # A backend other processes or machines write (PostgreSQL) is always shared.
        self.shared = (workerid.shared_sessions() or self.backend.shared) if shared is None else shared
        self.writer_id = f"{workerid.index() or 0}:{secrets.token_hex(6)}" if self.shared else None
        # The stamps are read on the request path (the backend reads them apart from `_lock`, which the writer
        # thread holds while it settles a big request).
        self.writer = writer or JournalWriter(self.backend, stamp=self.writer_id)
        self._lock = threading.RLock()  # the sessions' states, the read connection, the backlog's settling
        # The caches of aliases, tails and resends: held for a few dict operations only, so the request path
        # never waits behind the writer thread settling a big request under `_lock` (issue 10.3).
        self._cache_lock = threading.Lock()
        self._sessions: OrderedDict[str, SessionState] = OrderedDict()
        # The branch positions the cached sessions hold, kept as they change (`_cache_put`, `_cache_pop`,
        # `_set_entries`, all under `_lock`): the cache's bound is checked on every request and answer, and
        # summing 512 sessions each time cost ≈60 µs a check, one on the request path, one on the writer's.
        self._cached_entries = 0
        # Sessions dropped from the cache whose writes may not be committed yet: reading them back from the
        # database before then would see an old branch, so until the writer's barrier is passed the dropped
        # state itself is taken back.
        self._dropped: dict[str, tuple[SessionState, threading.Event]] = {}
        # Known tasks and agents: caches of facts in the database (a miss reads it; EnsureTask/EnsureAgent
        # are INSERT OR IGNORE), bounded like the other caches so a stream of new sessions cannot grow them.
        self._tasks: BoundedSet[str] = BoundedSet(CACHED_KNOWN)
        self._agents: BoundedSet[tuple[str, str]] = BoundedSet(CACHED_KNOWN)
        self._ordinals = OrdinalCache(CACHED_KNOWN, self.writer.barrier)
        self._aliases: OrderedDict[str, str] = OrderedDict()
        self._tails: OrderedDict[str, str | None] = OrderedDict()  # response id → its last item id
        self._resends: OrderedDict[str, tuple[int, Resend]] = OrderedDict()  # session → (generation, last input)
        self._resend_bytes = 0  # what `_resends` holds (`_resend_bytes_of` each), kept as it changes (_cache_lock)
        self._backlog: deque[Pending] = deque()  # see backlog.py
        self._settling = False
        self._ring_due = False  # a loop timer will ring the writer (see _after_append)
        self._ring_due_at = 0.0
        self.aliases = AliasView(self)
        self.writer.feed(lambda: self.settle(wait=False), lambda: bool(self._backlog))

    # ------------------------------------------------------------------ lifecycle
    def flush(self, timeout: float | None = 30.0) -> bool:
        self.settle()
        return self.writer.flush(timeout)

    def close(self) -> None:
        with self._cache_lock:
            timer, self._release_timer = self._release_timer, None
        if timer is not None:
            timer.cancel()
        self.settle()
        self.writer.close()
        if self._owns_backend:
            with self._lock:
                self.backend.close()

    def _submit(self, ops: Sequence[Op], since: float | None = None) -> None:
        self.writer.submit_many(ops, since)

    # ------------------------------------------------------------------ tasks and agents
    def create_task(self) -> str:
        """A fresh task id, registered synchronously (so sub-agents can join at once)."""
        task_id = new_task_id()
        with self._lock:
            self.backend.create_task(task_id, "cli", time.time())
            self._tasks.add(task_id)
        return task_id

    def task_exists(self, task_id: str) -> bool:
        if task_id in self._tasks:
            return True
        with self._lock:
            found = self.backend.task_exists(task_id)
            if found:
                self._tasks.add(task_id)
            return found

    def agent_exists(self, task_id: str, address: str) -> bool:
        with self._lock:
            if (task_id, address) in self._agents:
                return True
            return self.backend.agent_exists(task_id, address)

    # ------------------------------------------------------------------ sessions
    def resolve(self, identity: SessionIdentity, headers: Mapping[str, str],
                payload: Mapping[str, Any]) -> tuple[str, str, str]:
        """(journal session key, task id, agent address) of a request; raises JoinError."""
        return resolve_identity(identity, headers, payload, self.task_exists)

    def session(self, session_key: str, task_id: str | None = None, address: str | None = None,
                source: str | None = None) -> SessionState:
        """The state of a session, with everything the request path left for later journaled; loaded
        from the database, or created when new (creating needs `task_id` and `address`)."""
        self.settle()
        return self._session(session_key, task_id, address, source)

    def _session(self, session_key: str, task_id: str | None = None, address: str | None = None,
                 source: str | None = None, fresh: bool = False) -> SessionState:
        """The cached state of a session as it is (the backlog not settled). `fresh`: the caller's request minted
        the session, and its task with it (`begin_request`): nothing of either is in the database to read."""
        with self._lock:
            st = self._sessions.get(session_key)
            if st is not None:
                self._sessions.move_to_end(session_key)
                st.used_at = time.monotonic()
                return st
            if fresh and task_id is not None and address is not None:
                st = self._create(session_key, task_id, address, source, fresh=True)
            else:
                dropped = self._dropped.pop(session_key, None)
                st = dropped[0] if dropped is not None and not dropped[1].is_set() else self._load(session_key)
            if st is None:
                if task_id is None or address is None:
                    raise KeyError(f"unknown session {session_key!r}")
                st = self._create(session_key, task_id, address, source)
            st.used_at = time.monotonic()
            self._cache_put(session_key, st)
            while len(self._sessions) > CACHED_SESSIONS:
                self._drop(*self._cache_pop())
            self._bound_caches(keep=session_key)
            return st

    def refresh(self, st: SessionState) -> bool:
        """Shared sessions: when another process changed the session since this one last looked (its stamp in
        the database is another writer's), bring the cached state up to date from the database: the longer
        branch where one extends the other (the ids are chained content hashes), else the database's; the
        newer window. True when something changed. The database is the lock, not a process."""
        if not self.shared:
            return False
        row = self.backend.stamp(st.key)
        if row is None or row[0] == self.writer_id or (row[0], row[1]) == st.seen_stamp:
            return False
        with self._lock:
            self.settle()  # what this process left for later aligns against its own state first
            st.seen_stamp = (row[0], row[1])
            loaded = self._load(st.key)
            if loaded is None:
                return False
            mine, theirs = st.entries, loaded.entries
            n = common_prefix(mine, theirs)
            changed = False
            if n == len(mine) and len(theirs) > len(mine):
                self._set_entries(st, theirs)
                changed = True
            elif n < len(mine) and n < len(theirs):
                self._set_entries(st, theirs)
                st.generation += 1  # rewritten: the resend fast path no longer holds
                changed = True
            if loaded.window.ordinal > st.window.ordinal:
                st.window = loaded.window
                changed = True
            return changed

    def _schedule_release(self, delay: float) -> None:
        """Look for idle big sessions `delay` seconds from now (one timer at a time, off the event loop)."""
        with self._cache_lock:
            if self._release_timer is not None:
                return
            timer = self._release_timer = threading.Timer(max(delay, 0.01), self._release_idle)
        timer.daemon = True
        timer.name = "ctproxy-journal-release"
        timer.start()

    def _release_idle(self) -> None:
        """Let go of the big sessions nothing used for `release_after` seconds (their branch positions and
        last input), then hand the freed pages back (proxy/memory.py). A released session is read back from
        the database by its next request (after what this process wrote of it is committed: `_dropped`)."""
        with self._cache_lock:
            self._release_timer = None
        if self.writer._closed:
            return
        now = time.monotonic()
        next_due: float | None = None
        released = False
        with self._lock:
            for key, st in list(self._sessions.items()):
                if len(st.entries) < self.big_entries:
                    continue
                idle = now - st.used_at
                if idle < self.release_after:
                    due = self.release_after - idle
                    next_due = due if next_due is None else min(next_due, due)
                    continue
                self._cache_pop(key)
                self._resend_drop(key)
                self._drop(key, st)
                self.released += 1
                released = True
        if released:
            done = self.writer.barrier()
            self.writer.ring()
            if done.wait(30):
                with self._lock:
                    for k in [k for k, (_, ev) in self._dropped.items() if ev.is_set()]:
                        self._dropped.pop(k, None)
            memory.note_big_work(memory.BIG_BYTES)
        if next_due is not None:
            self._schedule_release(next_due)

    def _drop(self, key: str, st: SessionState) -> None:
        for k in [k for k, (_, done) in self._dropped.items() if done.is_set()]:
            self._dropped.pop(k, None)  # committed since: the database has them now
        self._dropped[key] = (st, self.writer.barrier())

    def cached_bytes(self) -> int:
        """What the session and resend caches hold, estimated: the branch positions and the kept inputs."""
        return self._resend_bytes + ENTRY_BYTES * self._cached_entries

    def _resend_keep(self, key: str, resend: tuple[int, Resend]) -> None:
        """Keep a session's last input for the byte-prefix fast path (the least recently kept beyond
        CACHED_RESENDS go)."""
        with self._cache_lock:
            old = self._resends.pop(key, None)
            if old is not None:
                self._resend_bytes -= _resend_bytes_of(old[1])
            self._resends[key] = resend
            self._resend_bytes += _resend_bytes_of(resend[1])
            while len(self._resends) > CACHED_RESENDS:
                self._resend_bytes -= _resend_bytes_of(self._resends.popitem(last=False)[1][1])

    def _resend_drop(self, key: str) -> tuple[int, Resend] | None:
        with self._cache_lock:
            old = self._resends.pop(key, None)
            if old is not None:
                self._resend_bytes -= _resend_bytes_of(old[1])
            return old

    def _cache_put(self, key: str, st: SessionState) -> None:
        """Cache a session's state (under `_lock`), counting its branch positions."""
        old = self._sessions.get(key)
        if old is not None:
            self._cached_entries -= len(old.entries)
        self._sessions[key] = st
        self._cached_entries += len(st.entries)

    def _cache_pop(self, key: str | None = None) -> tuple[str, SessionState]:
        """Take a session out of the cache (under `_lock`): `key`'s (KeyError when absent), or the least
        recently used."""
        if key is None:
            key, st = self._sessions.popitem(last=False)
        else:
            st = self._sessions.pop(key)
        self._cached_entries -= len(st.entries)
        return key, st

    def _set_entries(self, st: SessionState, entries: Branch) -> None:
        """A session's new branch (under `_lock`); the count follows when the state is the cached one."""
        if self._sessions.get(st.key) is st:
            self._cached_entries += len(entries) - len(st.entries)
        st.entries = entries

    def _bound_caches(self, keep: str | None = None) -> None:
        """Drop least recently used resends, then sessions, until the caches fit `cache_bytes` (a dropped
        session is read back from the database when next needed; a dropped resend only loses the byte-prefix
        fast path for that session's next request). `keep` (the session at hand) stays."""
        for k in [k for k, (_, done) in self._dropped.items() if done.is_set()]:
            self._dropped.pop(k, None)
        over = self.cached_bytes() - self.cache_bytes
        if over <= 0:
            return
        for key in list(self._resends):
            if over <= 0:
                break
            if key != keep and (old := self._resend_drop(key)) is not None:
                over -= _resend_bytes_of(old[1])
        for key in list(self._sessions):
            if over <= 0:
                break
            if key != keep and key in self._sessions:
                _, st = self._cache_pop(key)
                self._drop(key, st)
                over -= ENTRY_BYTES * len(st.entries)

    def _load(self, session_key: str) -> SessionState | None:
        row = self.backend.session(session_key)
        if row is None:
            return None
        task_id, address, source = row
        entries = Branch.of(Entry(*r) for r in self.backend.branch(session_key))
        window = self.backend.latest_window(session_key)
        self._tasks.add(task_id)
        self._agents.add((task_id, address))
        if window is None:
            window = self._new_window(session_key, task_id, address, None, "start", {})
        return SessionState(session_key, task_id, address, source, entries, window)

    def _create(self, session_key: str, task_id: str, address: str, source: str | None,
                fresh: bool = False) -> SessionState:
        """Register a new session (and its task and agent when not known); `fresh`: its task is new too, so its
        agent has no window yet (the first window's ordinal is not read from the database)."""
        now = time.time()
        ops: list[Op] = []
        if task_id not in self._tasks:
            ops.append(EnsureTask(task_id, "session", now))
            self._tasks.add(task_id)
        if (task_id, address) not in self._agents:
            ops.append(EnsureAgent(task_id, address, now))
            self._agents.add((task_id, address))
        ops.append(EnsureSession(session_key, task_id, address, source, now))
        if self.backend.claims_windows:
            # A store other instances write: the session and its first window are registered now, in one
            # transaction, so an instance that sees the session sees its window (the database is the lock).
            ordinal = self._peek_ordinal(task_id, address, fresh)
            w = Window(window_id(ordinal), ordinal, session_key, task_id, address, None, "start", {}, now)
            claimed = self.backend.create_session(ops, _put_window(w), self.writer_id)
            if claimed is None:  # another instance registered it first
                loaded = self._load(session_key)
                if loaded is not None:
                    return loaded
                raise KeyError(f"session {session_key!r} registered elsewhere and not found")
            self._ordinals.set((task_id, address), claimed.ordinal)
            return SessionState(session_key, task_id, address, source, Branch(), _window_of(claimed))
        self._submit(ops)
        window = self._new_window(session_key, task_id, address, None, "start", {}, fresh=fresh)
        return SessionState(session_key, task_id, address, source, Branch(), window,
                            registered=self.writer.barrier())

    def wait_registered(self, st: SessionState, timeout: float = 10.0) -> bool:
        """Block until the session's registration (task, agent, session, first window) and any window the
        request path opened since are committed: what a tool or CLI call in another process needs once the
        proxy has answered (read-your-writes). Runs off the event loop (`asyncio.to_thread`)."""
        ev = st.registered
        if ev is None or ev.is_set():
            return True
        self.writer.ring()
        done = ev.wait(timeout)
        if done and st.registered is ev:
            st.registered = None
        return done

    def _peek_ordinal(self, task_id: str, address: str, fresh: bool = False) -> int:
        """The ordinal the agent's next window gets (under the journal's lock: `_next_ordinal` follows).
        `fresh`: a task this process minted just now, which no process has opened a window of."""
        key = (task_id, address)
        known = self._ordinals.get(key)
        if fresh and known is None:
            known = 0
            self._ordinals.set(key, known)
        elif not fresh and (known is None or self.shared):  # shared: another process may have opened one since
            known = max(self.backend.max_ordinal(task_id, address), known or 0)
            self._ordinals.set(key, known)
        return known + 1

    def _next_ordinal(self, task_id: str, address: str, fresh: bool = False) -> int:
        ordinal = self._peek_ordinal(task_id, address, fresh)
        self._ordinals.set((task_id, address), ordinal)
        return ordinal

    def _new_window(self, session_key: str, task_id: str, address: str, boundary: str | None,
                    strategy: Strategy, bootstrap: dict[str, Any], boundary_pos: int | None = None,
                    boundary_hash: str | None = None, reason: str | None = None,
                    opaque: bytes | None = None,
                    named: Callable[[str], dict[str, Any]] | None = None, fresh: bool = False) -> Window:
        """`named(window_id)`: the bootstrap again for another id, when it names its window's own id. `fresh`:
        see `_create`."""
        ordinal = self._next_ordinal(task_id, address, fresh)
        w = Window(window_id(ordinal), ordinal, session_key, task_id, address, boundary, strategy, bootstrap,
                   time.time(), boundary_pos, boundary_hash, reason, opaque)
        if self.backend.claims_windows:
            # Opened now: INSERT … ON CONFLICT DO NOTHING on its key, the next ordinal when another instance took
            # this one (ADR 0013), and then a bootstrap that names the id is built again for the id it gets.
            renamed = (lambda op: op._replace(bootstrap=named(op.window_id))) if named is not None else None
            claimed = self.backend.claim_window(_put_window(w), self.writer_id, renamed)
            self._ordinals.set((task_id, address), claimed.ordinal)
            return _window_of(claimed)
        self._submit([_put_window(w)])
        return w

    # ------------------------------------------------------------------ windows API
    def current_window(self, session_key: str) -> Window:
        return self.session(session_key).window

    def start_window(self, session_key: str, boundary_item_id: str | None, strategy: Strategy,
                     bootstrap: dict[str, Any] | Callable[[Window | None, str], dict[str, Any]], *,
                     boundary_pos: int | None = None,
                     boundary_hash: str | None = None, reason: str | None = None,
                     opaque: bytes | None = None, follows: Sequence[str] | None = None) -> Window:
        """Open the session's next window (the one place window ids are assigned: `_new_window`).
        `follows`: the journal ids of the agent's items that follow the bootstrap in the request that
        opens it; they are filed in the new window (None: every item after the boundary on the branch).
        `bootstrap` may be built here, given the window it follows and the id this window gets (a notes
        bootstrap names both): window ids are assigned nowhere else.
        `boundary_item_id` is the last item (on the current branch)
        that the window's bootstrap replaces; None replaces nothing.

        A window that the context projection applies names its boundary in the agent's items instead:
        `boundary_pos` items, the last with one-chain id `boundary_hash`. It is the only record of that
        window, so it is opened even when the journal's branch does not hold that item (history off, or
        the agent left out an item the journal keeps): then `boundary_item_id` is None and an event says so.
        """
        with self._lock:
            st = self.session(session_key)
            if boundary_pos is None:
                if boundary_item_id is not None and self._position(st, boundary_item_id) is None:
                    raise ValueError(f"boundary {boundary_item_id!r} is not on the session's current branch")
            else:
                if boundary_item_id is None or self._position(st, boundary_item_id) is None:
                    on_branch = boundary_hash is not None and self._position(st, boundary_hash) is not None
                    boundary_item_id = boundary_hash if on_branch else None
                if boundary_item_id is None and st.entries:
                    self.record_event(session_key, "window_boundary", {"outcome": "off_branch",
                                                                       "boundary_pos": boundary_pos})
            # The agent's items after the boundary (a steer, a follow-up, the request that triggered the turn)
            # follow the new window's bootstrap: they are filed in it, where the model is told it is.
            at = self._position(st, boundary_item_id) if boundary_item_id is not None else None
            if follows is not None:
                carried = tuple(i for i in follows if i and self._position(st, i) is not None)
            else:
                carried = st.entries.ids[at + 1:] if at is not None else ()
            named = None
            if callable(bootstrap):
                build, prev = bootstrap, st.window

                def named(wid: str) -> dict[str, Any]:
                    return dict(build(prev, wid))

                bootstrap = named(window_id(self._peek_ordinal(st.task_id, st.address)))
            st.window = self._new_window(session_key, st.task_id, st.address, boundary_item_id, strategy,
                                         dict(bootstrap), boundary_pos, boundary_hash, reason, opaque, named)
            if carried:
                self._submit([FileItems(session_key, carried, st.window.window_id)])
            self.record_event(session_key, "window", {"window_id": st.window.window_id, "strategy": strategy,
                                                      "boundary_item_id": boundary_item_id})
            st.registered = self.writer.barrier()  # the answer waits for the new window too (read-your-writes)
            return st.window

    def window_of(self, session_key: str) -> Window | None:
        """The session's current window as this process knows it, without settling the backlog (the
        request path: windows are opened synchronously, never by the backlog's alignment, except the
        client's own compaction); None for a session the journal does not know."""
        try:
            return self._session(session_key).window
        except KeyError:
            return None

    def windows(self, session_key: str) -> list[Window]:
        """Committed windows of a session, oldest first (call `flush()` first to include recent ones)."""
        with self._lock:
            return self.backend.windows(session_key)

    def item_ids_for_session(self, session_key: str) -> list[str]:
        """The current branch, oldest first: the session's item hash chain."""
        with self._lock:
            return list(self.session(session_key).entries.ids)

    def chain_head(self, session_key: str) -> str | None:
        with self._lock:
            ids = self.session(session_key).entries.ids
            return ids[-1] if ids else None

    def branch_position(self, session_key: str, item_id: str) -> int | None:
        with self._lock:
            return self._position(self.session(session_key), item_id)

    @staticmethod
    def _position(st: SessionState, item_id: str) -> int | None:
        return st.entries.ids.last_index(item_id)

    def raw_items(self, item_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The committed items with these ids, as first seen, in the order asked (unknown ids left out)."""
        wanted = list(dict.fromkeys(i for i in item_ids if isinstance(i, str) and i))
        if not wanted:
            return []
        with self._lock:
            rows = self.backend.raw_items(wanted)
        found = {item_id: orjson.loads(raw) for item_id, raw in rows}
        return [found[i] for i in wanted if isinstance(found.get(i), dict)]

    def call_items(self, session_key: str, call_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """The committed call items of a session with these `call_id`s (the newest of each), as first seen:
        what a request that drops `previous_response_id` must carry for its outputs (call `flush()` first
        to include the last answer's). Calls the journal does not hold are absent."""
        wanted = [c for c in dict.fromkeys(call_ids) if isinstance(c, str) and c]
        if not wanted:
            return {}
        with self._lock:
            rows = self.backend.call_items(session_key, wanted, ANSWERED_CALL_TYPES)
        found: dict[str, dict[str, Any]] = {}
        for call_id, raw in rows:
            item = orjson.loads(raw)
            if isinstance(item, dict):
                found[call_id] = item  # (the newest wins)
        return found

    def alias_response(self, response_id: str, session_key: str) -> None:
        with self._lock:
            self._remember(self._aliases, response_id, session_key, CACHED_ALIASES)
        self._submit([PutAlias(response_id, session_key, time.time())])

    def sessions_for_responses(self, response_ids: Sequence[str]) -> dict[str, str]:
        """`session_for_response` of each id, those found: what this process knows without a query, the rest in
        one query (a backend without the batched read asks one by one)."""
        found = {k: v for k in response_ids if (v := self._aliases.get(k)) is not None}
        missing = [k for k in response_ids if k not in found]
        if not missing:
            return found
        many = getattr(self.backend, "sessions_for_responses", None)
        if many is None:
            for k in missing:
                if (v := self.session_for_response(k)) is not None:
                    found[k] = v
            return found
        with self._lock:
            got = many(missing)
            for k, v in got.items():
                self._remember(self._aliases, k, v, CACHED_ALIASES)
        return found | got

    def session_for_response(self, response_id: str) -> str | None:
        hit = self._aliases.get(response_id)  # a dict read: no lock to wait for on the request path
        if hit is not None:
            return hit
        with self._lock:
            found = self.backend.session_for_response(response_id)
            if found is None:
                return None
            self._remember(self._aliases, response_id, found, CACHED_ALIASES)
            return found

    def record_event(self, session_key: str, kind: str, detail: dict[str, Any] | None = None) -> None:
        self._submit([PutEvent(session_key, kind, dict(detail or {}), time.time())])

    def events(self, session_key: str) -> list[dict[str, Any]]:
        with self._lock:
            rows = self.backend.events(session_key)
        return [{"kind": r[0], "detail": orjson.loads(r[1]), "created_at": r[2]} for r in rows]

    def _remember(self, cache: OrderedDict, key: str, value: Any, cap: int) -> None:
        with self._cache_lock:
            cache[key] = value
            cache.move_to_end(key)
            while len(cache) > cap:
                cache.popitem(last=False)


def _resend_bytes_of(r: Resend) -> int:
    """What a kept input costs the cache: its bytes and its ids."""
    return len(r.whole) + 16 * len(r.ids)  # (8 bytes an id and 8 a position)


def _put_window(w: Window) -> PutWindow:
    return PutWindow(w.task_id, w.address, w.window_id, w.ordinal, w.session_key, w.boundary_item_id, w.strategy,
                     w.bootstrap, w.created_at, w.boundary_pos, w.boundary_hash, w.reason, w.opaque)


def _window_of(op: PutWindow) -> Window:
    return Window(op.window_id, op.ordinal, op.session_key, op.task_id, op.address, op.boundary_item_id, op.strategy,
                  op.bootstrap, op.created_at, op.boundary_pos, op.boundary_hash, op.reason, op.opaque)
