"""The journal on the embedded store (SQLite in WAL mode, the state directory's database): the `JournalBackend`
of proxy/store/interface.py, exactly the statements the journal has always run.

Three connections, as before the interface: the reads (`Journal`'s, under its lock), the session stamps (read on
the request path, so that check never waits behind a reader) and the writer thread's (`apply`, `index_text`), each
opened on first use. Readers for the history tools are one connection per thread (`history()`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from proxy.db import connect
from proxy.journal import migrate
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.model import Window, window_id
from proxy.journal.ops import Op, PutWindow
from proxy.journal.query import HistoryReader
from proxy.journal.store import BatchContext, apply_batch, apply_op, index_text

# (item id, canonical hash, type) of each position of a session's branch
BranchRow = tuple[str, str, str]


def connect_retrying(path: Path, attempts: int = 40) -> sqlite3.Connection:
    """`proxy.db.connect`, retried while another connection holds the lock during its WAL switch."""
    for i in range(attempts):
        try:
            return connect(path)
        except sqlite3.OperationalError:
            if i == attempts - 1:
                raise
            time.sleep(min(0.05 * (i + 1), 0.5))
    raise AssertionError("unreachable")


def _claim(conn: sqlite3.Connection, op: PutWindow, stamp: str | None,
           renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow:
    while True:
        bootstrap = orjson.dumps(op.bootstrap).decode()
        cur = conn.execute(
            "INSERT OR IGNORE INTO journal_windows(task_id, address, window_id, ordinal, session_key,"
            " boundary_item_id, strategy, bootstrap, created_at, boundary_pos, boundary_hash, reason, opaque)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (op.task_id, op.address, op.window_id, op.ordinal, op.session_key, op.boundary_item_id, op.strategy,
             bootstrap, op.created_at, op.boundary_pos, op.boundary_hash, op.reason, op.opaque))
        if cur.rowcount == 1:
            break
        op = op._replace(ordinal=op.ordinal + 1, window_id=window_id(op.ordinal + 1))
        if renamed is not None:
            op = renamed(op)  # a bootstrap that names its window's id names the id it gets
    if stamp is not None:
        conn.execute("INSERT INTO journal_session_stamps(session_key, writer, n) VALUES (?,?,1)"
                     " ON CONFLICT(session_key) DO UPDATE SET writer=excluded.writer, n=n+1", (op.session_key, stamp))
    return op


def window_from_row(row: Any) -> Window:
    opaque = row["opaque"]
    return Window(row["window_id"], row["ordinal"], row["session_key"], row["task_id"], row["address"],
                  row["boundary_item_id"], row["strategy"], orjson.loads(row["bootstrap"]), row["created_at"],
                  row["boundary_pos"], row["boundary_hash"], row["reason"],
                  bytes(opaque) if opaque is not None else None)


class SqliteJournal:
    """The embedded journal backend. `shared` is False: other processes on the same state directory are
    `ctproxy up --workers N` (proxy/workerid.py decides); windows are opened in the writer's batches."""

    kind = "embedded"
    shared = False
    # Windows and new sessions go in the writer's batches (INSERT OR IGNORE), as they always did: the request path
    # never waits for SQLite. `claim_window` / `create_session` open them at once (what PostgreSQL does always).
    claims_windows = False
    indexes_text = True  # the FTS5 index is brought up to date in bulk by the writer (index_text)

    def __init__(self, db_path: Path):
        self.db_path = db_path
        self._lock = threading.RLock()
        self._read_conn: sqlite3.Connection | None = None
        self._stamps_conn: sqlite3.Connection | None = None
        self._stamps_lock = threading.Lock()
        self._write_conn: sqlite3.Connection | None = None
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []

    # ---- connections ---------------------------------------------------------------------------------
    @property
    def _read(self) -> sqlite3.Connection:
        conn = self._read_conn
        if conn is None:
            with self._lock:
                if self._read_conn is None:
                    conn = connect_retrying(self.db_path)  # applies the schema
                    migrate.ensure(conn)  # an older state directory: its windows and checkpoints, once
                    self._read_conn = conn
                conn = self._read_conn
        return conn

    def open(self) -> None:
        """Apply the schema and the journal's migrations now (before a writer starts)."""
        _ = self._read

    def close(self) -> None:
        with self._lock:
            if self._read_conn is not None:
                self._read_conn.close()
                self._read_conn = None
        with self._stamps_lock:
            if self._stamps_conn is not None:
                self._stamps_conn.close()
                self._stamps_conn = None
        readers, self._readers = self._readers, []
        for conn in readers:
            try:
                conn.close()
            except sqlite3.ProgrammingError:
                pass
        self._local = threading.local()

    # ---- writes (the writer thread) -------------------------------------------------------------------
    def _writer(self) -> sqlite3.Connection:
        """The writer thread's connection; another process switching the database to WAL or applying its
        schema at the same moment can make opening fail briefly, so retry rather than let the thread die."""
        if self._write_conn is None:
            delay = 0.05
            while self._write_conn is None:
                try:
                    self._write_conn = connect(self.db_path)
                except sqlite3.OperationalError:
                    time.sleep(delay)
                    delay = min(delay * 2, 2.0)
        return self._write_conn

    def apply(self, ops: Sequence[Op], stamp: str | None = None) -> int:
        """The ops in one transaction (the session stamps of ADR 0012 with them); items inserted."""
        conn = self._writer()
        return apply_batch(conn, ops) if stamp is None else apply_batch(conn, ops, stamp=stamp)

    def index_text(self) -> int:
        return index_text(self._writer())

    def release_memory(self) -> None:
        """`PRAGMA shrink_memory`: the writer connection's page cache and FTS5's buffers, filled by a big request's
        100,000 items and its full-text indexing, are given back to malloc (measured in `ctproxy up`, bench_soak
        mem: ≈6 MB of the writer thread's glibc arena stayed resident after idle); the trim that follows returns
        them to the OS. The next write reads its pages again."""
        if self._write_conn is not None:
            self._write_conn.execute("PRAGMA shrink_memory")

    def close_writer(self) -> None:
        if self._write_conn is not None:
            self._write_conn.close()
            self._write_conn = None

    def claim_window(self, op: PutWindow, stamp: str | None = None,
                     renamed: Callable[[PutWindow], PutWindow] | None = None) -> PutWindow:
        """Open the window now, in a transaction of its own: INSERT OR IGNORE on its key, and when another
        writer holds that ordinal, the next one (made again by `renamed`, when given). The window as opened."""
        conn = self._writer_for_claims()
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                op = _claim(conn, op, stamp, renamed)
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return op

    def create_session(self, ops: Sequence[Op], window: PutWindow, stamp: str | None = None) -> PutWindow | None:
        """Register a session (its task and agent ops, then its EnsureSession last) with its first window, in
        one transaction; None when the session existed already (another writer registered it: load it)."""
        conn = self._writer_for_claims()
        with self._lock:
            conn.execute("BEGIN IMMEDIATE")
            try:
                *ensure, session = ops
                for op in ensure:
                    apply_op(conn, BatchContext(), op)
                cur = conn.execute(
                    "INSERT OR IGNORE INTO journal_sessions(session_key, task_id, address, source, created_at)"
                    " VALUES (?,?,?,?,?)", (session.session_key, session.task_id, session.address, session.source,
                                            session.created_at))
                claimed = _claim(conn, window, stamp) if cur.rowcount == 1 else None
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        return claimed

    def _writer_for_claims(self) -> sqlite3.Connection:
        return self._read  # claims run under `_lock`, like every statement on the read connection

    # ---- reads -----------------------------------------------------------------------------------------
    def create_task(self, task_id: str, origin: str, at: float) -> None:
        with self._lock:
            self._read.execute("INSERT INTO journal_tasks(task_id, origin, created_at) VALUES (?,?,?)",
                               (task_id, origin, at))

    def task_exists(self, task_id: str) -> bool:
        with self._lock:
            return self._read.execute("SELECT 1 FROM journal_tasks WHERE task_id=?", (task_id,)).fetchone() is not None

    def agent_exists(self, task_id: str, address: str) -> bool:
        with self._lock:
            return self._read.execute("SELECT 1 FROM journal_agents WHERE task_id=? AND address=?",
                                      (task_id, address)).fetchone() is not None

    def stamp(self, session_key: str) -> tuple[str, int] | None:
        with self._stamps_lock:
            if self._stamps_conn is None:
                self._stamps_conn = connect_retrying(self.db_path)
            row = self._stamps_conn.execute("SELECT writer, n FROM journal_session_stamps WHERE session_key=?",
                                            (session_key,)).fetchone()
        return (row[0], int(row[1])) if row is not None else None

    def session(self, session_key: str) -> tuple[str, str, str | None] | None:
        """(task id, address, source) of a session."""
        with self._lock:
            row = self._read.execute("SELECT task_id, address, source FROM journal_sessions WHERE session_key=?",
                                     (session_key,)).fetchone()
        return (row[0], row[1], row[2]) if row is not None else None

    def branch(self, session_key: str) -> list[BranchRow]:
        with self._lock:
            return [(r[0], r[1], r[2]) for r in self._read.execute(
                "SELECT i.item_id, i.canon_hash, i.type FROM journal_branch b JOIN journal_items i"
                " ON i.item_id = b.item_id WHERE b.session_key=? ORDER BY b.pos", (session_key,))]

    def latest_window(self, session_key: str) -> Window | None:
        with self._lock:
            row = self._read.execute("SELECT * FROM journal_windows WHERE session_key=? ORDER BY ordinal DESC"
                                     " LIMIT 1", (session_key,)).fetchone()
        return window_from_row(row) if row is not None else None

    def windows(self, session_key: str) -> list[Window]:
        with self._lock:
            rows = self._read.execute("SELECT * FROM journal_windows WHERE session_key=? ORDER BY ordinal",
                                      (session_key,)).fetchall()
        return [window_from_row(r) for r in rows]

    def max_ordinal(self, task_id: str, address: str) -> int:
        with self._lock:
            row = self._read.execute("SELECT max(ordinal) FROM journal_windows WHERE task_id=? AND address=?",
                                     (task_id, address)).fetchone()
        return int(row[0] or 0)

    def raw_items(self, item_ids: Sequence[str]) -> list[tuple[str, bytes]]:
        marks = ",".join("?" * len(item_ids))
        with self._lock:
            return [(r[0], r[1]) for r in self._read.execute(
                "SELECT i.item_id, r.raw FROM journal_items i JOIN journal_raw r ON r.seq = i.seq"
                f" WHERE i.item_id IN ({marks})", list(item_ids))]

    def call_items(self, session_key: str, call_ids: Sequence[str], types: Sequence[str]) -> list[tuple[str, bytes]]:
        """(call id, raw) of the session's items of these types with these call ids, in journal order."""
        marks, tmarks = ",".join("?" * len(call_ids)), ",".join("?" * len(types))
        with self._lock:
            return [(r[0], r[1]) for r in self._read.execute(
                "SELECT i.call_id, r.raw FROM journal_items i JOIN journal_raw r ON r.seq = i.seq"
                f" WHERE i.session_key=? AND i.call_id IN ({marks}) AND i.type IN ({tmarks}) ORDER BY i.seq",
                (session_key, *call_ids, *types))]

    def session_for_response(self, response_id: str) -> str | None:
        with self._lock:
            row = self._read.execute("SELECT session_key FROM journal_aliases WHERE response_id=?",
                                     (response_id,)).fetchone()
        return row[0] if row is not None else None

    def sessions_for_responses(self, response_ids: Sequence[str]) -> dict[str, str]:
        marks = ",".join("?" * len(response_ids))
        with self._lock:
            rows = self._read.execute(f"SELECT response_id, session_key FROM journal_aliases WHERE response_id IN"
                                      f" ({marks})", list(response_ids)).fetchall() if response_ids else []
        return {r[0]: r[1] for r in rows}

    def response_tail(self, response_id: str) -> str | None:
        with self._lock:
            row = self._read.execute("SELECT tail_item_id FROM journal_responses WHERE response_id=?",
                                     (response_id,)).fetchone()
        return row[0] if row is not None else None

    def events(self, session_key: str) -> list[tuple[str, str, float]]:
        """(kind, detail JSON, created_at) of the session's events, oldest first."""
        with self._lock:
            return [(r[0], r[1], r[2]) for r in self._read.execute(
                "SELECT kind, detail, created_at FROM journal_events WHERE session_key=? ORDER BY id",
                (session_key,))]

    def history(self) -> HistoryReader:
        """The history tools' reader: one connection per calling thread."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.db_path)
            with self._lock:
                self._readers.append(conn)
        return HistoryReader(conn)
