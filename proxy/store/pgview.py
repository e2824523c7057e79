"""A read-only, sqlite3-shaped connection over the PostgreSQL store, for the views people read
(proxy/app/sessionview.py: `ctproxy tasks`, `ctproxy show`): its queries are written in the SQL both databases speak,
with `?` placeholders, and read rows by position and by name as `sqlite3.Row` allows. One pooled connection,
held for the view's life (`close` gives it back)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from proxy.store.postgres import StoreError


class Row(tuple):
    """A row by position (a tuple) and by column name, with `keys()`, as sqlite3.Row."""

    _names: dict[str, int]

    def __new__(cls, names: dict[str, int], values: Sequence[Any]) -> Row:
        row = super().__new__(cls, (bytes(v) if isinstance(v, memoryview) else v for v in values))
        row._names = names
        return row

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._names[key])
        return tuple.__getitem__(self, key)

    def keys(self) -> list[str]:
        return list(self._names)


class Cursor:
    def __init__(self, rows: list[Row]):
        self._rows = rows

    def __iter__(self) -> Iterator[Row]:
        return iter(self._rows)

    def fetchone(self) -> Row | None:
        return self._rows[0] if self._rows else None

    def fetchall(self) -> list[Row]:
        return list(self._rows)


class PgViewConnection:
    dialect = "postgresql"

    def __init__(self, pool: Any):
        self._ctx = pool.connection()
        try:
            self._conn = self._ctx.__enter__()
        except Exception as exc:
            raise StoreError(f"the PostgreSQL store cannot be used: {str(exc).strip().splitlines()[0]}") from None
        # One read-only transaction for the view's life; the pooled connection is given back as it came (autocommit,
        # not read-only: proxy/store/pgconn.py), or the next writer on it would be refused.
        self._was = (self._conn.autocommit, self._conn.read_only)
        self._conn.autocommit = False
        self._conn.read_only = True

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        cur = self._conn.execute(sql.replace("?", "%s"), list(params))
        if cur.description is None:
            return Cursor([])
        names = {d.name: i for i, d in enumerate(cur.description)}
        return Cursor([Row(names, r) for r in cur.fetchall()])

    def close(self) -> None:
        try:
            self._conn.rollback()
            self._conn.read_only = self._was[1]
            self._conn.autocommit = self._was[0]
        finally:
            self._ctx.__exit__(None, None, None)
