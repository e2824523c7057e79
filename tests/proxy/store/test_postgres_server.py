"""The tests' private PostgreSQL server (tests/support/postgres.py): it starts, listens on loopback only, and
the role ctproxy connects as owns its database without being a superuser, yet may create `pg_trgm` and use it
for literal substring search (verified against the text, as the embedded store's FTS5 trigram search is)."""

from __future__ import annotations

import itertools

_COUNT = itertools.count()


def test_the_private_server_is_a_plain_owner_on_loopback(pg):
    import psycopg

    with psycopg.connect(pg.url) as conn:
        row = conn.execute("SELECT current_user, rolsuper, current_setting('listen_addresses') FROM pg_roles"
                           " WHERE rolname = current_user").fetchone()
        assert row == ("ctproxy", False, "127.0.0.1")
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()"
                             ).fetchone()[0]
        assert owner == "ctproxy"


def test_pg_trgm_finds_literal_substrings_case_sensitively(pg):
    import psycopg

    url = pg.fresh_database(f"trgm{next(_COUNT)}")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
        conn.execute("CREATE TABLE items (seq bigserial PRIMARY KEY, text text NOT NULL)")
        conn.execute("CREATE INDEX items_trgm ON items USING gin (text gin_trgm_ops)")
        texts = ["Hello World", "hello world", "50% off_sale", "a\\b path", "nothing here"] + [f"filler {i}"
                                                                                          for i in range(500)]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO items(text) VALUES (%s)", [(t,) for t in texts])

        def search(literal: str) -> list[str]:
            # LIKE with the literal's wildcards escaped (the trigram index answers it), then checked against
            # the text itself, as the embedded store does with FTS5 candidates.
            pattern = "%" + literal.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            rows = conn.execute("SELECT text FROM items WHERE text LIKE %s ORDER BY seq", (pattern,)).fetchall()
            return [r[0] for r in rows if literal in r[0]]

        assert search("World") == ["Hello World"]  # case-sensitive
        assert search("0% off_") == ["50% off_sale"]  # % and _ are literal
        assert search("a\\b") == ["a\\b path"]
        assert search("lo wo") == ["hello world"]
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN SELECT text FROM items WHERE text LIKE '%World%'"))
        assert "items_trgm" in plan
