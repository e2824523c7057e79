"""The journal's tables (registered with `proxy.db`; applied on every connect, idempotently).

Order of items everywhere is `seq`, the journal order: an item's parent is always journaled before
it, so along one branch `seq` is branch order. `journal_branch` is the manifest of each session's
current branch; items of other branches stay in `journal_items` (their heads in
`journal_branch_heads`). `journal_fts` is an FTS5 trigram index (case-sensitive) over the safe text;
search verifies every candidate against the text itself. The writer indexes items in bulk, a few
hundred at a time or a couple of seconds after they were journaled (store.index_text):
`journal_fts_state.indexed_seq` says how far the index goes, and search scans the few items after it.

A window is the only form of a context window or compaction checkpoint (ADR 0006): `journal_windows`
rows carry the strategy, the boundary (position in the agent's items + hash in the one chain) and the
bootstrap. Databases made before that are migrated once (proxy/journal/migrate.py, versioned in
`ctp_schema_versions`).
"""

from __future__ import annotations

from proxy.db import register_schema

DDL = """
CREATE TABLE IF NOT EXISTS journal_tasks (
    task_id TEXT PRIMARY KEY,
    origin TEXT NOT NULL,            -- cli | session
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS journal_agents (
    task_id TEXT NOT NULL,
    address TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (task_id, address)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_sessions (
    session_key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    address TEXT NOT NULL,
    source TEXT,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_sessions_by_agent ON journal_sessions(task_id, address);
CREATE TABLE IF NOT EXISTS journal_windows (
    task_id TEXT NOT NULL,
    address TEXT NOT NULL,
    window_id TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    session_key TEXT NOT NULL,
    boundary_item_id TEXT,           -- the journal item (on the branch) the bootstrap replaces up to
    strategy TEXT NOT NULL,          -- start | client_compaction | remote | fallback | notes | ...
    bootstrap TEXT NOT NULL,         -- JSON: what replaces the items before the boundary (per strategy)
    created_at REAL NOT NULL,
    boundary_pos INTEGER,            -- agent items the bootstrap replaces (NULL: a journal-only window)
    boundary_hash TEXT,              -- one-chain id of item boundary_pos-1 (proxy/items/canonical.py)
    reason TEXT,                     -- why the window was opened (a category, never content)
    opaque BLOB,                     -- the remote strategy's compaction item, byte for byte as received
    PRIMARY KEY (task_id, address, window_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ctp_schema_versions (
    name TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_windows_by_session ON journal_windows(session_key, ordinal);
CREATE TABLE IF NOT EXISTS journal_items (
    seq INTEGER PRIMARY KEY,
    item_id TEXT NOT NULL UNIQUE,
    session_key TEXT NOT NULL,
    parent_id TEXT,
    window_id TEXT NOT NULL,
    origin TEXT NOT NULL,            -- input | output
    type TEXT NOT NULL,
    role TEXT,
    tool_namespace TEXT,
    tool_name TEXT,
    call_id TEXT,
    upstream_id TEXT,
    response_id TEXT,
    control INTEGER NOT NULL DEFAULT 0,
    hidden INTEGER NOT NULL DEFAULT 0,
    canon_hash TEXT NOT NULL,
    text TEXT NOT NULL,              -- canonical safe text
    segments TEXT NOT NULL,          -- JSON [[start, end], ...]: searchable code-point ranges
    chars INTEGER NOT NULL,
    images INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_items_by_session ON journal_items(session_key, seq);
-- The item's JSON as first seen (images intact), apart so that scans of the text stay small.
CREATE TABLE IF NOT EXISTS journal_raw (
    seq INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_items_by_call ON journal_items(session_key, call_id) WHERE call_id IS NOT NULL;
CREATE TABLE IF NOT EXISTS journal_branch (
    session_key TEXT NOT NULL,
    item_id TEXT NOT NULL,
    pos INTEGER NOT NULL,
    PRIMARY KEY (session_key, item_id)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS journal_branch_by_pos ON journal_branch(session_key, pos);
-- Items of each window on the current branch, kept up to date with the manifest (list_windows, tasks).
CREATE TABLE IF NOT EXISTS journal_window_counts (
    session_key TEXT NOT NULL,
    window_id TEXT NOT NULL,
    visible INTEGER NOT NULL DEFAULT 0,  -- shown by a default list
    hidden INTEGER NOT NULL DEFAULT 0,   -- control messages and recovery-tool records
    PRIMARY KEY (session_key, window_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_branch_heads (
    session_key TEXT NOT NULL,
    head_item_id TEXT NOT NULL,
    length INTEGER NOT NULL,
    reason TEXT NOT NULL,
    archived_at REAL NOT NULL,
    PRIMARY KEY (session_key, head_item_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_responses (
    response_id TEXT PRIMARY KEY,
    session_key TEXT NOT NULL,
    model TEXT,
    status TEXT,
    usage TEXT,
    error TEXT,
    tail_item_id TEXT,
    item_count INTEGER NOT NULL,
    incomplete INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_responses_by_session ON journal_responses(session_key, created_at);
CREATE TABLE IF NOT EXISTS journal_aliases (
    response_id TEXT PRIMARY KEY,
    session_key TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS journal_events (
    id INTEGER PRIMARY KEY,
    session_key TEXT NOT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS journal_events_by_session ON journal_events(session_key, id);
CREATE VIRTUAL TABLE IF NOT EXISTS journal_fts USING fts5(
    text, content='journal_items', content_rowid='seq', tokenize='trigram case_sensitive 1'
);
-- Who last changed each session's branch or windows, and how often (`ctproxy up --workers N`): a worker that
-- cached the session reloads it when the stamp is another writer's (Journal._refresh). Written only then.
CREATE TABLE IF NOT EXISTS journal_session_stamps (
    session_key TEXT PRIMARY KEY,
    writer TEXT NOT NULL,
    n INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS journal_fts_state (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    indexed_seq INTEGER NOT NULL      -- items up to this seq are in journal_fts; search scans the rest
);
-- A journal written before the index was deferred has every item indexed already.
INSERT OR IGNORE INTO journal_fts_state(id, indexed_seq) SELECT 0, coalesce(max(seq), 0) FROM journal_items;
"""

register_schema("journal", DDL)
