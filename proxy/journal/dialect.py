"""The words in which the journal's one writer (store.py) and its reads (sqljournal.py, query.py) speak to a store's
SQL database: each statement is written once, with `?` placeholders, and a store's `Dialect` says the few things
its database says differently. The embedded store's is `SQLITE` (below); PostgreSQL's is in
proxy/store/pg_journal.py (a store supplies its dialect; the journal never imports a store).

What differs, and nothing else:
- placeholders (`sql`: `?` or `%s`) and a list of values (`any_of`: `IN (?, ?, …)` or `= ANY(%s)`, with how many
  values one statement may bind: `max_params`);
- an insert that skips a row already there (`insert_ignore`: `INSERT OR IGNORE` or `ON CONFLICT DO NOTHING`) and
  one that replaces it (`insert_replace`: `INSERT OR REPLACE` or `ON CONFLICT (key) DO UPDATE SET …`);
- the clock a row is stamped with (`clock`);
- the statements that are not the same in both: an item with its raw JSON (`insert_item`), a branch's positions
  (`put_positions`), and the per-session locks a shared database needs (`lock_sessions`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=256)  # (the journal's statements: a few dozen, built once rather than per row)
def insert_sql(table: str, columns: tuple[str, ...], values: str | None = None) -> str:
    """`INSERT INTO table(columns) VALUES (?, …)`, in `?` placeholders (or `values`, the list written out)."""
    return f"INSERT INTO {table}({', '.join(columns)}) VALUES ({values or ','.join('?' * len(columns))})"


@lru_cache(maxsize=256)
def _sqlite_insert(conflict: str, table: str, columns: tuple[str, ...], values: str | None = None) -> str:
    return f"INSERT {conflict}" + insert_sql(table, columns, values)[len("INSERT"):]


class Dialect:
    """SQLite's words (the embedded store): `?`, `IN (…)`, `INSERT OR IGNORE`, `INSERT OR REPLACE`, the caller's
    clock; an item and its raw JSON in two statements (`lastrowid`); no session locks (`BEGIN IMMEDIATE` holds the
    whole database)."""

    name = "sqlite"
    # SQLite binds at most 999 parameters per statement in older builds: lists are bound 500 at a time
    max_params: int | None = 500

    def sql(self, text: str) -> str:
        """A statement written with `?` placeholders, in this database's."""
        return text

    def any_of(self, column: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """`column` is one of `values`: the condition (in `?` placeholders) and its parameters."""
        return f"{column} IN ({','.join('?' * len(values))})", list(values)

    def insert_ignore(self, table: str, columns: tuple[str, ...], values: str | None = None) -> str:
        """An insert that leaves a row already there (on any key) as it is."""
        return _sqlite_insert("OR IGNORE", table, columns, values)

    def insert_replace(self, table: str, columns: tuple[str, ...], key: str) -> str:
        """An insert that replaces the row of the same `key` with this one."""
        return _sqlite_insert("OR REPLACE", table, columns)

    def clock(self) -> tuple[str, tuple[Any, ...]]:
        """The time a row is stamped with: (the SQL expression, its parameters)."""
        return "?", (time.time(),)

    def insert_item(self, conn: Any, columns: tuple[str, ...], values: Sequence[Any], raw: bytes) -> bool:
        """Insert an item (`columns` of journal_items, whose item_id may be there already) and, when it was new, its
        raw JSON under the item's `seq`. Whether it was new."""
        cur = conn.execute(self.insert_ignore("journal_items", columns), values)
        if cur.rowcount != 1:
            return False
        conn.execute("INSERT INTO journal_raw(seq, raw) VALUES (?, ?)", (cur.lastrowid, raw))
        return True

    def put_positions(self, conn: Any, session_key: str, from_pos: int, ids: Sequence[str]) -> None:
        """The branch manifest's rows `from_pos`, `from_pos + 1`, … for `ids` (the rows from `from_pos` on were
        deleted; an id already on the branch at another position takes its new one)."""
        # Rows made as SQLite takes them: a 100,000-item branch as a list was as many tuples and ints at once.
        conn.executemany("INSERT OR REPLACE INTO journal_branch(session_key, item_id, pos) VALUES (?,?,?)",
                         ((session_key, item_id, from_pos + i) for i, item_id in enumerate(ids)))

    def lock_sessions(self, conn: Any, keys: set[str]) -> None:
        """Lock the sessions whose branch or windows this transaction changes (a database several writers share
        a session in row by row); SQLite's `BEGIN IMMEDIATE` has locked the whole database already."""


SQLITE = Dialect()
