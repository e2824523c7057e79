"""PostgreSQL behind the store interface (proxy/store/interface.py): what several `ctproxy up`, on one machine or
several, share. Schema and migrations are proxy/store/postgres.py's (the one `ctproxy store migrate` creates).

Connections come from one `psycopg_pool.ConnectionPool` per store (sync: see the interface's docstring). Opening
the store brings the schema up to date under an advisory lock, so instances starting together never race their
`CREATE`s.

Notes: the contents live in `notes_files` (there is no shared filesystem), keyed by task, the agent's address
hash (the embedded store's directory name) and the path. A write or an append is one transaction that first takes
a transaction-scoped advisory lock on the note (a row lock cannot cover a note not yet written), then reads the old
content, checks the byte cap and upserts: two appends from any two machines both land, one after the other, and a
refused one changes nothing. A lock wait is bounded like the file lock's (`lock_timeout`). Times are the database
server's clock, so notes written through different machines order by one clock. The file store's shape is kept:
a note whose path is a "directory" of other notes, or that would sit below another note, is refused with the same
words.

Usage: `usage` and `usage_estimates` (migration 2), proxy/usage.py's statements.

Compaction's records: `compaction_sessions`, `compaction_progress`, `compaction_events` (ids from migration 3's
sequence) and `compaction_windows`, proxy/windows/remote/store.py's statements (migration 4 indexes the events).

Rollovers: `context_rollovers`, with the same statements as SQLite's (`ON CONFLICT … DO UPDATE … RETURNING`,
`DELETE … RETURNING`): taking a mark is one statement, so of two instances at most one gets it.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

from proxy.items.addresses import address_hash
from proxy.notes.paths import check_rel, check_task_id, is_valid_rel, quoted
from proxy.notes.store import LOCK_TIMEOUT, NOTE_MAX_BYTES, NoteError, NoteInfo, WriteResult, encode_note
from proxy.store import pgconn, postgres
from proxy.store.interface import StoreKind
from proxy.store.pg_journal import PgJournal
from proxy.store.pgconn import connection as _connection
from proxy.store.pgview import PgViewConnection
from proxy.store.postgres import StoreError
from proxy.usage import Usage
from proxy.windows.notes.pending import KINDS, Kind, Pending
from proxy.windows.remote.decision import LastRequest
from proxy.windows.remote.store import Event, SessionRecord

_NOW = "extract(epoch from clock_timestamp())"
_MIGRATE_LOCK = 0x63747078  # "ctpx": held while the schema is brought up to date


def _like_prefix(rel: str) -> str:
    """A LIKE pattern for every path below `rel/` (the wildcards in it escaped)."""
    return rel.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "/%"


def _note_lock_key(task_id: str, agent: str, rel: str) -> int:
    """A signed 64-bit key for pg_advisory_xact_lock, one per note."""
    digest = hashlib.sha256(f"{task_id}\x00{agent}\x00{rel}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgNotes:
    """The notes of one task, in `notes_files`."""

    def __init__(self, pool: Any, task_id: str, max_bytes: int = NOTE_MAX_BYTES, lock_timeout: float = LOCK_TIMEOUT):
        self.pool = pool
        self.task_id = check_task_id(task_id)
        self.max_bytes = max_bytes
        self.lock_timeout = lock_timeout

    def read(self, address: str, rel: str) -> str:
        check_rel(rel)
        agent = address_hash(address)
        with _connection(self.pool) as conn:
            row = conn.execute("SELECT content FROM notes_files WHERE task_id = %s AND agent_hash = %s AND path = %s",
                               (self.task_id, agent, rel)).fetchone()
            if row is None:
                if self._is_dir(conn, agent, rel):
                    raise NoteError(f"{quoted(rel)} is a directory; list it with notes_list_files_by_prefix")
                raise NoteError(f"note {quoted(rel)} does not exist; list notes with notes_list_files_by_prefix")
        return bytes(row[0]).decode("utf-8", errors="replace")

    def iter_files(self, address: str) -> Iterator[NoteInfo]:
        with _connection(self.pool) as conn:
            rows = conn.execute(
                "SELECT path, octet_length(content), created_at, updated_at FROM notes_files"
                " WHERE task_id = %s AND agent_hash = %s ORDER BY path",
                (self.task_id, address_hash(address))).fetchall()
        for path, size, created, updated in rows:
            if is_valid_rel(path):  # (a row copied in from files the tools could not address)
                yield NoteInfo(path, int(size), float(created), float(updated))

    def contents_matching(self, address: str, prefix: str, query: str) -> dict[str, str]:
        """The contents of the agent's notes under `prefix` that contain `query` (literal, case-sensitive), in one
        query: `notes_search_contents` reads these instead of one `read` per note (ADR 0013, "Cost on
        PostgreSQL"). UTF-8 makes a byte substring match exactly a text substring match."""
        with _connection(self.pool) as conn:
            rows = conn.execute(
                "SELECT path, content FROM notes_files WHERE task_id = %s AND agent_hash = %s"
                " AND starts_with(path, %s) AND position(%s::bytea in content) > 0",
                (self.task_id, address_hash(address), prefix, encode_note(query))).fetchall()
        return {path: bytes(content).decode("utf-8", errors="replace") for path, content in rows}

    def write(self, address: str, rel: str, text: str) -> WriteResult:
        return self._commit(address, rel, encode_note(text), append=False)

    def append(self, address: str, rel: str, text: str) -> WriteResult:
        return self._commit(address, rel, encode_note(text), append=True)

    def _is_dir(self, conn: Any, agent: str, rel: str) -> bool:
        return conn.execute("SELECT EXISTS (SELECT 1 FROM notes_files WHERE task_id = %s AND agent_hash = %s"
                            " AND path LIKE %s)", (self.task_id, agent, _like_prefix(rel))).fetchone()[0]

    def _commit(self, address: str, rel: str, data: bytes, append: bool) -> WriteResult:
        check_rel(rel)
        agent = address_hash(address)
        psycopg = postgres.driver()
        try:
            with _connection(self.pool) as conn, conn.transaction():
                conn.execute(f"SET LOCAL lock_timeout = {int(self.lock_timeout * 1000)}")
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_note_lock_key(self.task_id, agent, rel),))
                return self._commit_locked(conn, address, agent, rel, data, append)
        except psycopg.errors.LockNotAvailable:
            raise NoteError(f"note {quoted(rel)} is busy: another writer held its lock for {self.lock_timeout:g} s; "
                            "retry the call") from None

    def _commit_locked(self, conn: Any, address: str, agent: str, rel: str, data: bytes, append: bool) -> WriteResult:
        row = conn.execute("SELECT content FROM notes_files WHERE task_id = %s AND agent_hash = %s AND path = %s",
                           (self.task_id, agent, rel)).fetchone()
        if row is None:
            if self._is_dir(conn, agent, rel):
                raise NoteError(f"{quoted(rel)} is a directory; choose a file name inside it")
            parts = rel.split("/")
            ancestors = ["/".join(parts[:i]) for i in range(1, len(parts))]
            if ancestors:
                found = conn.execute("SELECT path FROM notes_files WHERE task_id = %s AND agent_hash = %s"
                                     " AND path = ANY(%s) ORDER BY length(path) LIMIT 1",
                                     (self.task_id, agent, ancestors)).fetchone()
                if found is not None:
                    raise NoteError(f"cannot use {quoted(rel)}: {quoted(found[0])} is a file, not a directory")
        old = bytes(row[0]) if row is not None and append else b""
        new = old + data if append else data
        if len(new) > self.max_bytes:
            raise NoteError(
                f"note {quoted(rel)} would be {len(new)} bytes; the limit is {self.max_bytes} UTF-8 bytes per file"
                + (f" (it has {len(old)}; {self.max_bytes - len(old)} left)" if append else "")
                + ". Write a shorter text or start another note.")
        conn.execute(
            "INSERT INTO notes_files(task_id, agent_hash, address, path, content, created_at, updated_at)"
            f" VALUES (%s, %s, %s, %s, %s, {_NOW}, {_NOW}) ON CONFLICT (task_id, agent_hash, path)"
            " DO UPDATE SET content = excluded.content, updated_at = excluded.updated_at,"
            " address = COALESCE(notes_files.address, excluded.address)",
            (self.task_id, agent, address, rel, new))
        return WriteResult(len(new), len(data), row is None)


_ROLLOVER_COLUMNS = "task_id, address, kind, origin, window_id, requested_at"


def _pending(row: Any) -> Pending | None:
    if row is None:
        return None
    task_id, address, kind, origin, window_id, at = row
    return Pending(task_id, address, kind, origin, window_id, float(at))


class PgRollovers:
    def __init__(self, pool: Any):
        self.pool = pool

    def mark(self, task_id: str, address: str, kind: Kind = "new_context", origin: str = "tool",
             window_id: str | None = None) -> Pending:
        if kind not in KINDS:
            raise ValueError(f"unknown rollover kind {kind!r}")
        with _connection(self.pool) as conn:
            row = conn.execute(
                f"INSERT INTO context_rollovers({_ROLLOVER_COLUMNS}) VALUES (%s, %s, %s, %s, %s, {_NOW})"
                " ON CONFLICT (task_id, address) DO UPDATE SET"
                " kind = CASE WHEN excluded.kind = 'checkpoint' THEN 'checkpoint' ELSE context_rollovers.kind END,"
                " origin = CASE WHEN excluded.kind = 'checkpoint' THEN excluded.origin"
                " ELSE context_rollovers.origin END"
                f" RETURNING {_ROLLOVER_COLUMNS}", (task_id, address, kind, origin, window_id)).fetchone()
        pending = _pending(row)
        assert pending is not None
        return pending

    def peek(self, task_id: str, address: str) -> Pending | None:
        with _connection(self.pool) as conn:
            return _pending(conn.execute(f"SELECT {_ROLLOVER_COLUMNS} FROM context_rollovers"
                                         " WHERE task_id = %s AND address = %s", (task_id, address)).fetchone())

    def take(self, task_id: str, address: str, kinds: tuple[Kind, ...] = KINDS) -> Pending | None:
        with _connection(self.pool) as conn:
            return _pending(conn.execute(
                "DELETE FROM context_rollovers WHERE task_id = %s AND address = %s AND kind = ANY(%s)"
                f" RETURNING {_ROLLOVER_COLUMNS}", (task_id, address, list(kinds))).fetchone())


_USAGE_COLUMNS = "session_key, task, agent, model, input_tokens, output_tokens, total_tokens, response_id, updated_at"


def _usage(row: Any) -> Usage | None:
    if row is None:
        return None
    key, task, agent, model, inp, out, total, response_id, at = row
    return Usage(key, task, agent, model, int(inp), int(out), None if total is None else int(total), response_id,
                 float(at))


class PgUsage:
    """`usage` and `usage_estimates`, with proxy/usage.py's statements. `at` defaults to the caller's clock, as there:
    it is when the answer was seen, compared with the proxy's in-process cache."""

    def __init__(self, pool: Any):
        self.pool = pool

    def record(self, session_key: str, task: str | None, agent: str | None, model: str | None, usage: dict,
               response_id: str | None, at: float | None = None) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                f"INSERT INTO usage({_USAGE_COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (session_key) DO UPDATE SET task = excluded.task, agent = excluded.agent,"
                " model = excluded.model, input_tokens = excluded.input_tokens,"
                " output_tokens = excluded.output_tokens, total_tokens = excluded.total_tokens,"
                " response_id = excluded.response_id, updated_at = excluded.updated_at"
                " WHERE excluded.updated_at >= usage.updated_at",  # a late write never replaces a newer answer
                (session_key, task, agent, model, int(usage.get("input_tokens") or 0),
                 int(usage.get("output_tokens") or 0), usage.get("total_tokens"), response_id, at or time.time()))

    def record_estimate(self, session_key: str, task: str | None, agent: str | None, model: str | None,
                        input_tokens: int, at: float | None = None) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                "INSERT INTO usage_estimates(session_key, task, agent, model, input_tokens, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (session_key) DO UPDATE SET task = excluded.task,"
                " agent = excluded.agent, model = excluded.model, input_tokens = excluded.input_tokens,"
                " updated_at = excluded.updated_at",
                (session_key, task, agent, model, int(input_tokens), at or time.time()))

    def for_session(self, session_key: str) -> Usage | None:
        with _connection(self.pool) as conn:
            return _usage(conn.execute(f"SELECT {_USAGE_COLUMNS} FROM usage WHERE session_key = %s",
                                       (session_key,)).fetchone())

    def for_agent(self, task: str, agent: str) -> Usage | None:
        with _connection(self.pool) as conn:
            return _usage(conn.execute(f"SELECT {_USAGE_COLUMNS} FROM usage WHERE task = %s AND agent = %s"
                                       " ORDER BY updated_at DESC LIMIT 1", (task, agent)).fetchone())

    def estimate_for_agent(self, task: str, agent: str) -> Usage | None:
        with _connection(self.pool) as conn:
            row = conn.execute("SELECT session_key, task, agent, model, input_tokens, updated_at FROM usage_estimates"
                               " WHERE task = %s AND agent = %s ORDER BY updated_at DESC LIMIT 1",
                               (task, agent)).fetchone()
        if row is None:
            return None
        return Usage(row[0], row[1], row[2], row[3], int(row[4]), 0, None, None, float(row[5]))


class PgCompaction:
    """Compaction's records, with proxy/windows/remote/store.py's statements (`at` / `updated_at` the caller's clock,
    as there: the events of one session order by their id, from one sequence)."""

    kind: StoreKind = "postgresql"

    def __init__(self, pool: Any):
        self.pool = pool

    def session_state(self, session_key: str) -> SessionRecord | None:
        return self.session_state_and_usage(session_key)[0]

    def session_state_and_usage(self, session_key: str) -> tuple[SessionRecord | None, Usage | None]:
        """`session_state` and the session's stored usage (`PgUsage.for_session`) in one round trip: what the
        compaction stage reads for a request of a session this process did not write last (addons/compaction.py)."""
        u = ", ".join(f"u.{c}" for c in _USAGE_COLUMNS.split(", "))
        with _connection(self.pool) as conn:
            row = conn.execute(
                "SELECT s.checkpoint_id, s.client_items, s.sent_bytes, s.force_compact, s.failed_items,"
                f" p.compacted_items, {u} FROM (SELECT %s::text AS k) q"
                " LEFT JOIN compaction_sessions s ON s.session_key = q.k"
                " LEFT JOIN compaction_progress p ON p.session_key = q.k"
                " LEFT JOIN usage u ON u.session_key = q.k", (session_key,)).fetchone()
        return self._record(row[:6]), _usage(row[6:]) if row[6] is not None else None

    @staticmethod
    def _record(row: Any) -> SessionRecord | None:
        cp_id, client_items, sent, force, failed, done = row
        done = None if done is None else int(done)
        if client_items is None:
            return None if done is None else SessionRecord(LastRequest(None, 0, 0), False, None, done)
        return SessionRecord(LastRequest(cp_id, int(client_items), int(sent)), bool(force),
                             None if failed is None else int(failed), done)

    def record_forwarded(self, session_key: str, checkpoint_id: str | None, client_items: int,
                         sent_bytes: int) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                "INSERT INTO compaction_sessions(session_key, checkpoint_id, client_items, sent_bytes, force_compact,"
                " updated_at) VALUES (%s, %s, %s, %s, 0, %s) ON CONFLICT (session_key) DO UPDATE SET"
                " checkpoint_id = excluded.checkpoint_id, client_items = excluded.client_items,"
                " sent_bytes = excluded.sent_bytes, force_compact = 0, updated_at = excluded.updated_at",
                (session_key, checkpoint_id, client_items, sent_bytes, time.time()))

    def mark_force_compact(self, session_key: str) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                "INSERT INTO compaction_sessions(session_key, checkpoint_id, client_items, sent_bytes, force_compact,"
                " updated_at) VALUES (%s, NULL, 0, 0, 1, %s) ON CONFLICT (session_key) DO UPDATE SET"
                " force_compact = 1, updated_at = excluded.updated_at", (session_key, time.time()))

    def mark_failed(self, session_key: str, client_items: int) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                "INSERT INTO compaction_sessions(session_key, checkpoint_id, client_items, sent_bytes, failed_items,"
                " updated_at) VALUES (%s, NULL, 0, 0, %s, %s) ON CONFLICT (session_key) DO UPDATE SET"
                " failed_items = excluded.failed_items, updated_at = excluded.updated_at",
                (session_key, client_items, time.time()))

    def record_compacted(self, session_key: str, client_items: int) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                "INSERT INTO compaction_progress(session_key, compacted_items, updated_at) VALUES (%s, %s, %s)"
                " ON CONFLICT (session_key) DO UPDATE SET compacted_items = excluded.compacted_items,"
                " updated_at = excluded.updated_at", (session_key, client_items, time.time()))

    def record_event(self, session_key: str, kind: str, outcome: str, reason: str | None = None,
                     checkpoint_id: str | None = None) -> None:
        with _connection(self.pool) as conn:
            conn.execute("INSERT INTO compaction_events(session_key, at, kind, outcome, reason, checkpoint_id)"
                         " VALUES (%s, %s, %s, %s, %s, %s)",
                         (session_key, time.time(), kind, outcome, reason, checkpoint_id))

    def events(self, session_key: str | None = None, limit: int = 200) -> list[Event]:
        cols = "session_key, at, kind, outcome, reason, checkpoint_id"
        with _connection(self.pool) as conn:
            if session_key is None:
                rows = conn.execute(f"SELECT {cols} FROM compaction_events ORDER BY id DESC LIMIT %s",
                                    (limit,)).fetchall()
            else:
                rows = conn.execute(f"SELECT {cols} FROM compaction_events WHERE session_key = %s"
                                    " ORDER BY id DESC LIMIT %s", (session_key, limit)).fetchall()
        return [Event(k, float(at), kind, outcome, reason, cp) for k, at, kind, outcome, reason, cp in reversed(rows)]

    def learn_window(self, model: str, endpoint: str, window_tokens: int) -> None:
        with _connection(self.pool) as conn:
            conn.execute(
                "INSERT INTO compaction_windows(model, endpoint, window_tokens, updated_at) VALUES (%s, %s, %s, %s)"
                " ON CONFLICT (model, endpoint) DO UPDATE SET"
                " window_tokens = least(compaction_windows.window_tokens, excluded.window_tokens),"
                " updated_at = excluded.updated_at", (model, endpoint, window_tokens, time.time()))

    def learned_window(self, model: str, endpoint: str | None = None) -> int | None:
        with _connection(self.pool) as conn:
            if endpoint is None:  # the smallest learned for the model anywhere (compaction/store.py)
                row = conn.execute("SELECT min(window_tokens) FROM compaction_windows WHERE model = %s",
                                   (model,)).fetchone()
            else:
                row = conn.execute("SELECT window_tokens FROM compaction_windows WHERE model = %s AND endpoint = %s",
                                   (model, endpoint)).fetchone()
        return int(row[0]) if row is not None and row[0] is not None else None


class PostgresStore:
    """A PostgreSQL database as ctproxy's store: `PostgresStore.open(url)` connects, migrates and pools."""

    kind: StoreKind = "postgresql"

    def __init__(self, pool: Any):
        self.pool = pool
        self._rollovers = PgRollovers(pool)
        self._usage = PgUsage(pool)
        self._compaction = PgCompaction(pool)
        self._journal: PgJournal | None = None

    @classmethod
    def open(cls, url: str, *, min_size: int = 1, max_size: int = 8, timeout: float = 30.0) -> PostgresStore:
        """`timeout`: how long a call waits for a connection before it is a StoreError (the database unreachable)."""
        if not url.startswith(("postgresql://", "postgres://")):
            raise StoreError(f"not a PostgreSQL URL: {url.split('@')[-1]!r} (postgresql://USER@HOST:PORT/DB)")
        postgres.driver()
        try:
            from psycopg_pool import ConnectionPool
        except ImportError:
            raise StoreError("PostgreSQL needs psycopg_pool: pip install 'ctproxy[postgres]'") from None
        with postgres.connect(url) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (_MIGRATE_LOCK,))
            try:
                postgres.migrate(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATE_LOCK,))
                conn.commit()
        pool = ConnectionPool(url, min_size=min_size, max_size=max_size, timeout=timeout, open=False,
                              connection_class=pgconn.counting_classes()[0], configure=pgconn.configure)
        try:
            pool.open(wait=True, timeout=timeout)
        except Exception as exc:
            pool.close()
            raise StoreError(f"cannot connect to PostgreSQL: {str(exc).strip().splitlines()[0]}") from None
        return cls(pool)

    def notes(self, task_id: str) -> PgNotes:
        return PgNotes(self.pool, task_id)

    @property
    def rollovers(self) -> PgRollovers:
        return self._rollovers

    @property
    def usage(self) -> PgUsage:
        return self._usage

    def journal(self) -> PgJournal:
        """The journal in this database (proxy/store/pg_journal.py), on the store's pool."""
        if self._journal is None:
            self._journal = PgJournal(self.pool)
        return self._journal

    def compaction(self) -> PgCompaction:
        return self._compaction

    def view(self) -> PgViewConnection:
        """A read-only pooled connection for the views people read (proxy/store/pgview.py; closed by the caller)."""
        return PgViewConnection(self.pool)

    def close(self) -> None:
        self.pool.close()
