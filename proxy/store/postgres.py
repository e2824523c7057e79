"""PostgreSQL: the shared store's schema, versioned migrations, and the copy of an embedded state into it.

Driver: psycopg 3 (imported only here, and only when used: `pip install 'ctproxy[postgres]'`). Why not asyncpg:
the store is used from threads (the journal's writer, the tool server's executors, the CLI) as much as from
event loops; psycopg has both sync and async connections, its own pool package, and COPY, which the copy below
uses; asyncpg is asyncio only.

Migrations are numbered; `migrate(conn)` applies those above the version recorded in `ctp_schema_versions`
(name `store`), each in its own transaction, so a database is brought up to date step by step and a failed step
leaves it at the previous version. The embedded store versions its own changes the same way (proxy/journal/
migrate.py, the same table).

The tables mirror the embedded ones column for column (TEXT → text, REAL → double precision, INTEGER → bigint,
BLOB → bytea), apart from: the FTS5 tables, which PostgreSQL replaces by a `pg_trgm` GIN index on
`journal_items.text` (literal substring search, verified against the text as FTS5 candidates are), and the
notes, whose contents live in `notes_files` (there is no shared filesystem between machines).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from proxy.errors import StoreError
from proxy.state import StateDir

SCHEMA_NAME = "store"

V1 = """
CREATE EXTENSION IF NOT EXISTS pg_trgm;
CREATE TABLE IF NOT EXISTS journal_tasks (task_id text PRIMARY KEY, origin text NOT NULL,
    created_at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS journal_agents (task_id text NOT NULL, address text NOT NULL,
    created_at double precision NOT NULL, PRIMARY KEY (task_id, address));
CREATE TABLE IF NOT EXISTS journal_sessions (session_key text PRIMARY KEY, task_id text NOT NULL,
    address text NOT NULL, source text, created_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS journal_sessions_by_agent ON journal_sessions(task_id, address);
CREATE TABLE IF NOT EXISTS journal_windows (task_id text NOT NULL, address text NOT NULL, window_id text NOT NULL,
    ordinal bigint NOT NULL, session_key text NOT NULL, boundary_item_id text, strategy text NOT NULL,
    bootstrap text NOT NULL, created_at double precision NOT NULL, boundary_pos bigint, boundary_hash text,
    reason text, opaque bytea, PRIMARY KEY (task_id, address, window_id));
CREATE INDEX IF NOT EXISTS journal_windows_by_session ON journal_windows(session_key, ordinal);
CREATE TABLE IF NOT EXISTS journal_items (seq bigint PRIMARY KEY, item_id text NOT NULL UNIQUE,
    session_key text NOT NULL, parent_id text, window_id text NOT NULL, origin text NOT NULL, type text NOT NULL,
    role text, tool_namespace text, tool_name text, call_id text, upstream_id text, response_id text,
    control bigint NOT NULL DEFAULT 0, hidden bigint NOT NULL DEFAULT 0, canon_hash text NOT NULL,
    text text NOT NULL, segments text NOT NULL, chars bigint NOT NULL, images bigint NOT NULL,
    created_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS journal_items_by_session ON journal_items(session_key, seq);
CREATE INDEX IF NOT EXISTS journal_items_by_call ON journal_items(session_key, call_id) WHERE call_id IS NOT NULL;
CREATE INDEX IF NOT EXISTS journal_items_text_trgm ON journal_items USING gin (text gin_trgm_ops);
CREATE TABLE IF NOT EXISTS journal_raw (seq bigint PRIMARY KEY, raw bytea NOT NULL);
CREATE TABLE IF NOT EXISTS journal_branch (session_key text NOT NULL, item_id text NOT NULL, pos bigint NOT NULL,
    PRIMARY KEY (session_key, item_id), UNIQUE (session_key, pos));
CREATE TABLE IF NOT EXISTS journal_window_counts (session_key text NOT NULL, window_id text NOT NULL,
    visible bigint NOT NULL DEFAULT 0, hidden bigint NOT NULL DEFAULT 0, PRIMARY KEY (session_key, window_id));
CREATE TABLE IF NOT EXISTS journal_branch_heads (session_key text NOT NULL, head_item_id text NOT NULL,
    length bigint NOT NULL, reason text NOT NULL, archived_at double precision NOT NULL,
    PRIMARY KEY (session_key, head_item_id));
CREATE TABLE IF NOT EXISTS journal_responses (response_id text PRIMARY KEY, session_key text NOT NULL, model text,
    status text, usage text, error text, tail_item_id text, item_count bigint NOT NULL,
    incomplete bigint NOT NULL DEFAULT 0, created_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS journal_responses_by_session ON journal_responses(session_key, created_at);
CREATE TABLE IF NOT EXISTS journal_aliases (response_id text PRIMARY KEY, session_key text NOT NULL,
    created_at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS journal_events (id bigint PRIMARY KEY, session_key text NOT NULL, kind text NOT NULL,
    detail text NOT NULL, created_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS journal_events_by_session ON journal_events(session_key, id);
CREATE TABLE IF NOT EXISTS journal_session_stamps (session_key text PRIMARY KEY, writer text NOT NULL,
    n bigint NOT NULL);
CREATE TABLE IF NOT EXISTS usage (session_key text PRIMARY KEY, task text, agent text, model text,
    input_tokens bigint, output_tokens bigint, total_tokens bigint, response_id text,
    updated_at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS compaction_sessions (session_key text PRIMARY KEY, checkpoint_id text,
    client_items bigint NOT NULL, sent_bytes bigint NOT NULL, force_compact bigint NOT NULL DEFAULT 0,
    failed_items bigint, updated_at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS compaction_events (id bigint PRIMARY KEY, session_key text NOT NULL,
    at double precision NOT NULL, kind text NOT NULL, outcome text NOT NULL, reason text, checkpoint_id text);
CREATE TABLE IF NOT EXISTS compaction_progress (session_key text PRIMARY KEY, compacted_items bigint NOT NULL,
    updated_at double precision NOT NULL);
CREATE TABLE IF NOT EXISTS compaction_windows (model text NOT NULL, endpoint text NOT NULL,
    window_tokens bigint NOT NULL, updated_at double precision NOT NULL, PRIMARY KEY (model, endpoint));
CREATE TABLE IF NOT EXISTS context_rollovers (task_id text NOT NULL, address text NOT NULL, kind text NOT NULL,
    origin text NOT NULL, window_id text, requested_at double precision NOT NULL, PRIMARY KEY (task_id, address));
CREATE TABLE IF NOT EXISTS notes_files (task_id text NOT NULL, agent_hash text NOT NULL, address text,
    path text NOT NULL, content bytea NOT NULL, created_at double precision NOT NULL,
    updated_at double precision NOT NULL, PRIMARY KEY (task_id, agent_hash, path));
"""

# 2: request estimates before a session's first answer with usage (proxy/usage.py's `usage_estimates`, added to the
# embedded store after 1 was written), and the by-agent indexes both usage tables have there.
V2 = """
CREATE TABLE IF NOT EXISTS usage_estimates (session_key text PRIMARY KEY, task text, agent text, model text,
    input_tokens bigint NOT NULL, updated_at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS usage_estimates_by_agent ON usage_estimates(task, agent, updated_at);
CREATE INDEX IF NOT EXISTS usage_by_agent ON usage(task, agent, updated_at);
"""

# 3: the journal served from PostgreSQL (proxy/store/pg_journal.py): items, events and compaction events number
# themselves from sequences (SQLite's INTEGER PRIMARY KEY did), each started after what a copy put there.
SEQUENCES: tuple[tuple[str, str], ...] = (("journal_items", "seq"), ("journal_events", "id"),
                                          ("compaction_events", "id"))
V3 = "\n".join(
    f"CREATE SEQUENCE IF NOT EXISTS {table}_{col}_seq OWNED BY {table}.{col};\n"
    f"ALTER TABLE {table} ALTER COLUMN {col} SET DEFAULT nextval('{table}_{col}_seq');\n"
    f"SELECT setval('{table}_{col}_seq', coalesce((SELECT max({col}) FROM {table}), 0) + 1, false);"
    for table, col in SEQUENCES)

# 4: compaction's records served from PostgreSQL (proxy/store/pg.py, PgCompaction): a session's events by id,
# as the embedded store's index reads them (`ctproxy tasks`, the session view).
V4 = """
CREATE INDEX IF NOT EXISTS compaction_events_by_session ON compaction_events(session_key, id);
"""

MIGRATIONS: tuple[tuple[int, str], ...] = ((1, V1), (2, V2), (3, V3), (4, V4))

# The embedded tables copied, in an order that keeps references ahead of what refers to them.
TABLES: tuple[str, ...] = (
    "journal_tasks", "journal_agents", "journal_sessions", "journal_windows", "journal_items", "journal_raw",
    "journal_branch", "journal_window_counts", "journal_branch_heads", "journal_responses", "journal_aliases",
    "journal_events", "journal_session_stamps", "usage", "usage_estimates", "compaction_sessions",
    "compaction_events", "compaction_progress", "compaction_windows", "context_rollovers",
)
NOTES_TABLE = "notes_files"


def driver() -> Any:
    """psycopg, or a StoreError saying how to install it (the PostgreSQL store is an extra)."""
    try:
        import psycopg
    except ImportError:
        raise StoreError("PostgreSQL needs psycopg: pip install 'ctproxy[postgres]' (psycopg 3 and its pool)") from None
    return psycopg


def connect(url: str) -> Any:
    psycopg = driver()
    if not url.startswith(("postgresql://", "postgres://")):
        raise StoreError(f"not a PostgreSQL URL: {url.split('@')[-1]!r} (postgresql://USER@HOST:PORT/DB)")
    try:
        return psycopg.connect(url)
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to PostgreSQL: {str(exc).strip().splitlines()[0]}") from None


def schema_version(conn: Any) -> int:
    conn.execute("CREATE TABLE IF NOT EXISTS ctp_schema_versions (name text PRIMARY KEY, version bigint NOT NULL)")
    row = conn.execute("SELECT version FROM ctp_schema_versions WHERE name = %s", (SCHEMA_NAME,)).fetchone()
    conn.commit()
    return int(row[0]) if row else 0


def migrate(conn: Any) -> list[int]:
    """Apply every migration above the database's version, each in its own transaction; the versions applied."""
    done: list[int] = []
    current = schema_version(conn)
    for version, ddl in MIGRATIONS:
        if version <= current:
            continue
        with conn.transaction():
            conn.execute(ddl)
            conn.execute("INSERT INTO ctp_schema_versions(name, version) VALUES (%s, %s) ON CONFLICT (name)"
                         " DO UPDATE SET version = excluded.version", (SCHEMA_NAME, version))
        done.append(version)
    return done


def sync_sequences(conn: Any) -> None:
    """Start each sequence after the rows already there (a copy brings its own numbers)."""
    for table, col in SEQUENCES:
        conn.execute(f"SELECT setval('{table}_{col}_seq', coalesce((SELECT max({col}) FROM {table}), 0) + 1, false)")


@dataclass
class CopyReport:
    rows: dict[str, int] = field(default_factory=dict)  # table → rows copied
    migrations: list[int] = field(default_factory=list)


def _sqlite_tables(src: sqlite3.Connection) -> set[str]:
    return {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(src: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in src.execute(f"PRAGMA table_info({table})")]


def _notes(state: StateDir) -> Iterator[tuple[str, str, str | None, str, bytes, float, float]]:
    """(task, agent hash, address, path, content, created_at, updated_at) of every note file."""
    root = state.root / "notes"
    if not root.is_dir():
        return
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        meta_root = task_dir / ".ctp"
        for agent_dir in sorted(p for p in task_dir.iterdir() if p.is_dir() and p.name != ".ctp"):
            address_file = meta_root / agent_dir.name / "address"
            address = address_file.read_text(encoding="utf-8").strip() if address_file.exists() else None
            for path in sorted(p for p in agent_dir.rglob("*") if p.is_file() and not p.is_symlink()):
                rel = path.relative_to(agent_dir).as_posix()
                st = path.stat()
                created = st.st_mtime
                meta = meta_root / agent_dir.name / "meta" / (rel + ".json")
                try:
                    created = float(json.loads(meta.read_text(encoding="utf-8"))["created_at"])
                except (OSError, ValueError, KeyError, TypeError):
                    pass
                yield task_dir.name, agent_dir.name, address, rel, path.read_bytes(), created, st.st_mtime


def copy_state(state: StateDir, url: str, progress: Callable[[str, int], None] | None = None) -> CopyReport:
    """Copy an embedded state (its database and notes) into the PostgreSQL database at `url`, in one
    transaction: the target's tables must be empty (nothing is merged or overwritten), and every table's row
    count is checked against the source before it commits."""
    report = CopyReport()
    db_path = state.db_path
    if not db_path.exists():
        raise StoreError(f"{state.root} holds no ctproxy database (ctproxy.db)")
    src = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        with connect(url) as conn:
            report.migrations = migrate(conn)
            present = _sqlite_tables(src)
            with conn.transaction():
                for table in (*TABLES, NOTES_TABLE):
                    if conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table})").fetchone()[0]:
                        raise StoreError(f"the target database already holds {table} rows: migrate into an "
                                         "empty database (nothing is merged)")
                for table in TABLES:
                    if table not in present:
                        report.rows[table] = 0
                        continue
                    cols = _columns(src, table)
                    n = 0
                    with conn.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") as copy:
                        for row in src.execute(f"SELECT {', '.join(cols)} FROM {table}"):
                            copy.write_row(row)
                            n += 1
                    report.rows[table] = n
                    if progress is not None:
                        progress(table, n)
                n = 0
                with conn.cursor() as cur, cur.copy(f"COPY {NOTES_TABLE} (task_id, agent_hash, address, path, content,"
                                                    " created_at, updated_at) FROM STDIN") as copy:
                    for note in _notes(state):
                        copy.write_row(note)
                        n += 1
                report.rows[NOTES_TABLE] = n
                if progress is not None:
                    progress(NOTES_TABLE, n)
                sync_sequences(conn)
                for table in TABLES:
                    want = src.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if table in present else 0
                    got = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                    if want != got:
                        raise StoreError(f"{table}: {got} rows arrived of {want}; nothing was committed")
    finally:
        src.close()
    return report


def search_items(url: str, literal: str, limit: int = 50) -> list[tuple[int, str]]:
    """(seq, text) of the journal items whose text contains `literal` (case-sensitive): the trigram index
    answers a LIKE with the literal's wildcards escaped, and each candidate is verified against the text."""
    pattern = "%" + literal.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    with connect(url) as conn:
        rows = conn.execute("SELECT seq, text FROM journal_items WHERE text LIKE %s ORDER BY seq LIMIT %s",
                            (pattern, limit)).fetchall()
    return [(int(seq), text) for seq, text in rows if literal in text]
