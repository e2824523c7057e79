"""The state store (issue 32, docs/adr/0013-one-store-interface.md): the one interface the state parts call
(interface.py), the embedded store behind it (embedded.py: SQLite in WAL mode plus note files, the default), and
PostgreSQL (pg.py, over the schema, versioned migrations and `ctproxy store migrate --to URL` of postgres.py).

Behind the interface: notes, pending rollovers, usage, the journal (pg_journal.py on PostgreSQL,
proxy/journal/sqlite_backend.py embedded), the compaction records and learned windows, and the read-only views
of the dashboard and `ctproxy tasks`/`show` (pgview.py), on both stores, wired by `ctproxy up --store URL`
(choice.py: `--store` > CTPROXY_STORE > store.url > embedded). What stays in each state directory: its token, CA,
run files and logs, and what machine-local tools keep (ADR 0013).
"""
