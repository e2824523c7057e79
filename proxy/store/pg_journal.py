"""The journal on PostgreSQL: the `JournalBackend` (proxy/journal/port.py) over proxy/store/postgres.py's tables.

The writes and reads are the journal's own, written once (proxy/journal/store.py, sqljournal.py, query.py), spoken
in PostgreSQL's words (`PgDialect`): `%s` placeholders, `= ANY(array)` for `IN (?, ?, …)`, `ON CONFLICT DO NOTHING`
for `INSERT OR IGNORE`, `ON CONFLICT (key) DO UPDATE` for `INSERT OR REPLACE`, the server's clock, an item and its
raw JSON in one statement (`WITH … RETURNING seq`), a branch's positions in one (`unnest`). Items get their `seq`
from a sequence (migration 3), so two instances never collide on it; the order of a session is its branch
manifest (`journal_branch.pos`), not `seq`.

Several instances write the same sessions (a stateless conversation whose turns land on any of them), so:
- a batch takes a transaction-scoped advisory lock on each session whose branch or windows it changes, in one
  order (sorted keys): two batches on one session run one after the other, and the merge of a branch append
  with what another writer put there (ADR 0012) reads a manifest nobody else is changing;
- every session a batch changes gets the writer's stamp, and an instance that cached the session reloads it
  when the stamp is another's (`Journal.refresh`);
- a window is opened at once (`claim_window`): `INSERT … ON CONFLICT DO NOTHING` on its key (task, agent, window
  id, the id made from the ordinal), and when another instance took that ordinal, the next one; a new session is
  registered with its first window in one transaction (`create_session`), so whoever sees the session sees it.

Search: `text LIKE '%literal%'` (wildcards escaped), which the `pg_trgm` GIN index answers, and every candidate is
verified against the text and its segments (proxy/journal/excerpt.find_matches), as FTS5 candidates are.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from proxy.journal.dialect import Dialect, insert_sql
from proxy.journal.query import ITEM_COLS, ON_BRANCH, HistoryReader
from proxy.journal.sqljournal import SqlJournal
from proxy.store.interface import StoreKind
from proxy.store.pgconn import connection

_NOW = "extract(epoch from clock_timestamp())"


def _session_lock_key(session_key: str) -> int:
    digest = hashlib.sha256(b"journal\x00" + session_key.encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class PgDialect(Dialect):
    """PostgreSQL's words for the journal's statements (proxy/journal/dialect.py)."""

    name = "postgresql"
    max_params = None  # a list is one array parameter

    def __init__(self) -> None:
        self._spoken: dict[str, str] = {}  # statement in `?` → in `%s` (the journal's statements: a bounded set)
        self._item_sql: dict[tuple[str, ...], str] = {}

    def sql(self, text: str) -> str:
        spoken = self._spoken.get(text)
        if spoken is None:
            if len(self._spoken) > 4096:
                self._spoken.clear()
            spoken = self._spoken[text] = text.replace("?", "%s")
        return spoken

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(?)", [list(values)]

    def insert_ignore(self, table: str, columns: tuple[str, ...], values: str | None = None) -> str:
        return insert_sql(table, columns, values) + " ON CONFLICT DO NOTHING"

    def insert_replace(self, table: str, columns: tuple[str, ...], key: str) -> str:
        return (insert_sql(table, columns) + f" ON CONFLICT ({key}) DO UPDATE SET "
                + ", ".join(f"{c} = excluded.{c}" for c in columns if c != key))

    def clock(self) -> tuple[str, tuple[Any, ...]]:
        return _NOW, ()  # the database server's clock, one for every instance

    def insert_item(self, conn: Any, columns: tuple[str, ...], values: Sequence[Any], raw: bytes) -> bool:
        # The item and its raw JSON in one statement (one round trip): the raw row only when the item was new.
        sql = self._item_sql.get(columns)
        if sql is None:
            sql = self._item_sql[columns] = self.sql(
                f"WITH ins AS ({insert_sql('journal_items', columns)} ON CONFLICT (item_id) DO NOTHING RETURNING seq)"
                " INSERT INTO journal_raw(seq, raw) SELECT seq, ? FROM ins RETURNING seq")
        return conn.execute(sql, (*values, raw)).fetchone() is not None

    def put_positions(self, conn: Any, session_key: str, from_pos: int, ids: Sequence[str]) -> None:
        conn.execute("INSERT INTO journal_branch(session_key, item_id, pos) SELECT %s, t.id, %s + t.n - 1"
                     " FROM unnest(%s::text[]) WITH ORDINALITY AS t(id, n)"
                     " ON CONFLICT (session_key, item_id) DO UPDATE SET pos = excluded.pos",
                     (session_key, from_pos, list(ids)))

    def lock_sessions(self, conn: Any, keys: set[str]) -> None:
        """Transaction-scoped advisory locks on the sessions, in one order (two batches on one session run one after
        the other; no two wait on each other crosswise)."""
        for key in sorted(keys):
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_session_lock_key(key),))


PG = PgDialect()


WALK_ROWS = 1024  # history search: the first chunk of newest items walked (_candidates)
_WORDS = re.compile(r"[A-Za-z0-9]{3,}")  # the words of a literal pg_trgm looks up (three letters or digits or more)
_TRIGRAM_ROW_COST = 2.0  # a row the trigram bitmap rechecks, against a row walked (they read and test the same text)
_TRIGRAM_FIXED = 2000  # the trigram path's fixed cost in rows walked (its posting lists, a sort, a transaction)


def _like_any(word: str) -> str:
    return "%" + word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _prefer_trigram(hits: int, walked: int, cand: int, left: int, want: int = 64) -> bool:
    """After a chunk that did not fill a page: whether the trigram index is cheaper than walking on, from what the
    chunk showed. Walking on reads about `want / hit rate` more items (all `left` for a literal not seen); the
    trigram bitmap rechecks the rows that hold the literal's words (`cand / walked` of the `left` items)."""
    walk = left if hits == 0 else min(left, want * walked / hits)
    trigram = _TRIGRAM_FIXED + _TRIGRAM_ROW_COST * left * cand / walked
    return trigram < walk


def _dict_rows() -> Any:
    from psycopg.rows import dict_row

    return dict_row


class PgHistoryReader(HistoryReader):
    """The history tools' reads (proxy/journal/query.HistoryReader, the same statements in PostgreSQL's words) on
    the store's pool; search through the trigram index with every candidate verified (HistoryReader.search)."""

    def __init__(self, pool: Any):
        super().__init__(None, PG)  # type: ignore[arg-type]
        self.pool = pool

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with connection(self.pool) as conn, conn.cursor(row_factory=_dict_rows()) as cur:
            return cur.execute(self.dialect.sql(sql), params).fetchall()

    def _candidates(self, keys: list[str], query: str, where: str, params: list[Any],
                    recent_first: bool) -> Iterator[Any]:
        # (`where` comes from HistoryReader.search, in SQLite's placeholders)
        # The caller verifies candidates as they come and stops at its limit. Which plan is cheap depends on how
        # often the literal occurs, which the planner cannot know (a LIKE '%…%' is estimated by its length alone):
        # walking the newest items finds a frequent literal in a page or two and reads every item for a rare one;
        # the trigram index finds a rare one at once, but its bitmap holds every row that has the literal's
        # trigrams, and rechecks them all, when its words are common. So the data decides (ADR 0013, "History
        # search"): walk the newest items in chunks (WALK_ROWS, growing), counting in each chunk the literal's
        # hits and the rows the trigram index would hand over (`_prefer_trigram`); continue by the trigram index
        # (its bitmap, the only plan allowed there) in keyset pages once that is the cheaper road.
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        where = self.dialect.sql(where)
        order, before = ("DESC", "<") if recent_first else ("ASC", ">")
        words = [w.lower() for w in _WORDS.findall(query)]
        if not words:  # nothing the trigram index could look up: walk, in keyset pages
            yield from self._pages(keys, pattern, where, params, order, before)
            return
        approx = [_like_any(w) for w in words]
        after, page, chunk = None, 64, WALK_ROWS
        while True:
            rows, walked, edge, cand, first = self._walk(keys, pattern, where, params, order, after, page, chunk,
                                                         approx)
            yield from rows
            if len(rows) == page:  # (the caller wants more: the walk goes on after the last one)
                after, page = rows[-1]["seq"], min(page * 4, 4096)
                continue
            if walked < chunk:
                return  # the walk read every item there is
            after = edge
            left = abs(edge - first) if first is not None else 0
            if _prefer_trigram(len(rows), walked, cand, left):
                break
            chunk = min(chunk * 4, 65536)
        cond = f"i.session_key = ANY(%s) AND i.text LIKE %s AND {ON_BRANCH} AND {where}"
        page = 64
        while True:
            rows = self._trigram(
                f"WITH c AS MATERIALIZED (SELECT seq FROM journal_items WHERE text LIKE %s)"
                f" SELECT {ITEM_COLS}, i.text, i.segments FROM c JOIN journal_items i ON i.seq = c.seq"
                f" WHERE {cond} AND i.seq {before} %s ORDER BY i.seq {order} LIMIT %s",
                [pattern, keys, pattern, *params, after, page])
            yield from rows
            if len(rows) < page:
                return
            after, page = rows[-1]["seq"], min(page * 4, 4096)

    def _pages(self, keys: list[str], pattern: str, where: str, params: list[Any], order: str,
               before: str) -> Iterator[Any]:
        """Matching items in journal order, a keyset page at a time, each after the last."""
        base = (f"SELECT {ITEM_COLS}, i.text, i.segments FROM journal_items i"
                f" WHERE i.session_key = ANY(%s) AND i.text LIKE %s AND {ON_BRANCH} AND {where}")
        after, page = None, 64
        while True:
            keyset = "" if after is None else f" AND i.seq {before} %s"
            rows = self._all(f"{base}{keyset} ORDER BY i.seq {order} LIMIT %s",
                             [keys, pattern, *params, *(() if after is None else (after,)), page])
            yield from rows
            if len(rows) < page:
                return
            after, page = rows[-1]["seq"], min(page * 4, 4096)

    def _walk(self, keys: list[str], pattern: str, where: str, params: list[Any], order: str, after: int | None,
              page: int, chunk: int, approx: list[str]) -> tuple[list[Any], int, int, int, int | None]:
        """The next `chunk` items of the sessions after `after`, newest (`DESC`) or oldest first, and the first `page`
        of them that match: (those rows in order, how many items were walked, the seq of the last one walked, how
        many of them hold every word of the literal in any case (what the trigram index would hand over), the seq
        of the sessions' last item that way). A full page is one query that stops at it; the chunk's figures are
        read only when the page is not full."""
        edge, before = ("min", "<") if order == "DESC" else ("max", ">")
        keyset = "" if after is None else f" AND i.seq {before} %s"
        walk = (f"SELECT * FROM journal_items i WHERE i.session_key = ANY(%s){keyset} ORDER BY i.seq {order}"
                f" LIMIT %s")
        walk_args = [keys, *(() if after is None else (after,)), chunk]
        rows = self._all(f"SELECT {ITEM_COLS}, i.text, i.segments FROM ({walk}) i WHERE i.text LIKE %s"
                         f" AND {ON_BRANCH} AND {where} ORDER BY i.seq {order} LIMIT %s",
                         [*walk_args, pattern, *params, page])
        if len(rows) == page:
            return rows, chunk, rows[-1]["seq"], 0, None
        cand = " AND ".join(["lower(i.text) LIKE %s"] * len(approx)) or "false"
        stats = self._all(
            f"SELECT count(*) AS walked, {edge}(i.seq) AS edge, count(*) FILTER (WHERE {cand}) AS cand,"
            f" (SELECT {edge}(x.seq) FROM journal_items x WHERE x.session_key = ANY(%s)) AS first FROM ({walk}) i",
            [*approx, keys, *walk_args])[0]
        return rows, int(stats["walked"]), stats["edge"], int(stats["cand"]), stats["first"]

    def _trigram(self, sql: str, params: Sequence[Any]) -> list[Any]:
        """`sql` with the trigram index's bitmap as the only way to find the literal's rows (no sequential scan):
        one round trip (pipelined)."""
        with connection(self.pool) as conn, conn.pipeline(), conn.transaction():
            conn.execute("SET LOCAL enable_seqscan = off")
            with conn.cursor(row_factory=_dict_rows()) as cur:
                cur.execute(sql, params)
                return cur.fetchall()


class PgJournal(SqlJournal):
    """The journal in a PostgreSQL database several instances share (`shared`, `claims_windows`)."""

    kind: StoreKind = "postgresql"
    dialect = PG
    shared = True
    claims_windows = True
    indexes_text = False  # the trigram index is kept by PostgreSQL itself

    def __init__(self, pool: Any):
        self.pool = pool
        self._history = PgHistoryReader(pool)

    def open(self) -> None:
        """The schema is brought up to date when the store opens (PostgresStore.open)."""

    def close(self) -> None:
        """The pool is the store's, closed with it."""

    def close_writer(self) -> None:
        """The writer's connections are the pool's."""

    def release_memory(self) -> None:
        """Nothing to free: the server caches the pages; psycopg keeps a query's buffers only while it runs."""

    def index_text(self) -> int:
        return 0

    def _reading(self) -> Any:
        return connection(self.pool)

    @contextmanager
    def _writing(self, locked: set[str]) -> Iterator[Any]:
        # Pipeline mode: the statements whose answers nothing reads go out without waiting for them (a turn's
        # batch is a handful of round trips, not one per statement).
        with connection(self.pool) as conn, conn.pipeline(), conn.transaction():
            PG.lock_sessions(conn, locked)
            yield conn

    @contextmanager
    def _claiming(self, locked: set[str]) -> Iterator[Any]:
        with connection(self.pool) as conn, conn.transaction():
            PG.lock_sessions(conn, locked)
            yield conn

    def history(self) -> PgHistoryReader:
        return self._history
