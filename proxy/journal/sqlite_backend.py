"""The journal on the embedded store (SQLite in WAL mode, the state directory's database): the `JournalBackend`
(port.py) of sqljournal.py's one writer and reads in SQLite's words (dialect.SQLITE); what is here is where its
connections come from, and the full-text index (FTS5) only SQLite keeps.

Three connections, as before the interface: the reads (`Journal`'s, under its lock), the session stamps (read on
the request path, so that check never waits behind a reader) and the writer thread's (`apply`, `index_text`), each
opened on first use. Readers for the history tools are one connection per thread (`history()`).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from proxy.db import connect
from proxy.journal import migrate
from proxy.journal import schema as _schema  # noqa: F401  (registers the tables)
from proxy.journal.dialect import SQLITE
from proxy.journal.ops import Op
from proxy.journal.query import HistoryReader
from proxy.journal.sqljournal import BranchRow as BranchRow  # (re-exported)
from proxy.journal.sqljournal import SqlJournal
from proxy.journal.sqljournal import window_from_row as window_from_row  # (re-exported)
from proxy.journal.store import apply_ops


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


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """A write transaction (`BEGIN IMMEDIATE`: it holds the database's write lock from its first statement)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def apply_batch(conn: sqlite3.Connection, ops: Iterable[Op], between: Callable[[], None] | None = None,
                stamp: str | None = None) -> int:
    """Apply ops in one transaction (store.apply_ops in SQLite's words). Returns how many items were inserted.
    `between` runs after each op. `stamp`: the writer's id when other processes write the same sessions."""
    with immediate(conn):
        return apply_ops(conn, SQLITE, ops, stamp, between)


def index_text(conn: sqlite3.Connection) -> int:
    """Add every item journaled since the last call (by any process) to the full-text index, in one
    transaction and one statement. Measured, indexing each turn's items in its own commit was about a
    third of the writer's SQLite time; a few hundred at once cost a fraction of that per item."""
    with immediate(conn):
        (done,) = conn.execute("SELECT indexed_seq FROM journal_fts_state WHERE id = 0").fetchone()
        n = conn.execute("INSERT INTO journal_fts(rowid, text) SELECT seq, text FROM journal_items WHERE seq > ?"
                         " ORDER BY seq", (done,)).rowcount
        if n:
            conn.execute("UPDATE journal_fts_state SET indexed_seq = (SELECT max(seq) FROM journal_items)"
                         " WHERE id = 0")
    return n


class SqliteJournal(SqlJournal):
    """The embedded journal backend. `shared` is False: other processes on the same state directory are
    `ctproxy up --workers N` (proxy/workerid.py decides); windows are opened in the writer's batches."""

    kind = "embedded"
    dialect = SQLITE
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
        """The ops in one transaction on the writer thread's connection (the session stamps of ADR 0012 with
        them); items inserted."""
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

    @contextmanager
    def _claiming(self, locked: set[str]) -> Iterator[sqlite3.Connection]:
        # claims run on the read connection under `_lock`, like every statement on it
        with self._lock, immediate(self._read) as conn:
            yield conn

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            yield self._read

    @contextmanager
    def _stamps(self) -> Iterator[sqlite3.Connection]:
        # its own connection: the request path's check never waits behind a reader
        with self._stamps_lock:
            if self._stamps_conn is None:
                self._stamps_conn = connect_retrying(self.db_path)
            yield self._stamps_conn

    def history(self) -> HistoryReader:
        """The history tools' reader: one connection per calling thread."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = connect(self.db_path)
            with self._lock:
                self._readers.append(conn)
        return HistoryReader(conn)
