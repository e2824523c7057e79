"""The state store beyond the embedded one (issue 32): PostgreSQL's schema, its versioned migrations, and
`ctproxy store migrate --to URL`, which copies an embedded state directory into it (postgres.py).

The embedded store (SQLite in WAL mode plus notes files, proxy/db.py, proxy/journal/, proxy/notes/) stays the one
`ctproxy up` runs on; serving from PostgreSQL (`--store postgresql://…`) is not built yet (docs/adr/0012-proxy-
workers.md, "Not done here").
"""
