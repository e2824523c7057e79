"""A pooled PostgreSQL connection for the store's parts (proxy/store/pg.py, proxy/store/pg_journal.py), and the count
of the round trips this process made to the store.

Every pooled connection is a `CountingConnection` in autocommit mode: a statement alone is one round trip (no
`BEGIN` before it, no `COMMIT` after it); what must be atomic says so with `conn.transaction()`. The count
(`proxy.metrics.store_round_trips()`) is kept by the thread that waited: the journal's writer thread (`journal`:
off the request path) and every other thread (`request`: the proxy's database thread, the event loop, the tool
server's executors). It is `ctproxy_store_round_trips_total` in /metrics; tests/proxy/store/test_store_two_instances.py
reads it
per request."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from proxy.metrics import count_store_round_trip as count_round_trip
from proxy.store import postgres
from proxy.store.postgres import StoreError

_classes: tuple[Any, Any] | None = None


def counting_classes() -> tuple[Any, Any]:
    """(connection class, cursor class) that count each round trip: a statement outside a pipeline, a
    transaction command psycopg sends (`BEGIN`, `COMMIT`, `ROLLBACK`), a whole pipeline."""
    global _classes
    if _classes is not None:
        return _classes
    psycopg = postgres.driver()

    class CountingCursor(psycopg.Cursor):  # type: ignore[misc, name-defined]
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            if self._conn._pipeline is None:
                count_round_trip()
            return super().execute(*args, **kwargs)

        def executemany(self, *args: Any, **kwargs: Any) -> Any:
            if self._conn._pipeline is None:
                count_round_trip()  # (psycopg pipelines an executemany where the server can)
            return super().executemany(*args, **kwargs)

    class CountingConnection(psycopg.Connection):  # type: ignore[misc, name-defined]
        def _exec_command(self, command: Any, *args: Any, **kwargs: Any) -> Any:
            if self._pipeline is None:
                count_round_trip()
            return super()._exec_command(command, *args, **kwargs)

        @contextmanager
        def pipeline(self) -> Iterator[Any]:
            outer = self._pipeline is None
            with super().pipeline() as p:
                yield p
            if outer:
                count_round_trip()

    _classes = (CountingConnection, CountingCursor)
    return _classes


def configure(conn: Any) -> None:
    """The pool's `configure`: autocommit (one round trip a statement) and counted cursors."""
    conn.autocommit = True
    conn.cursor_factory = counting_classes()[1]


@contextmanager
def connection(pool: Any) -> Iterator[Any]:
    """A pooled connection; a database that cannot be reached (gone, restarted, no connection free in time) is a
    `StoreError` saying so. A lock wait that ran out (`LockNotAvailable`) is left to the caller, which words it."""
    psycopg = postgres.driver()
    from psycopg_pool import PoolTimeout

    try:
        with pool.connection() as conn:
            yield conn
    except psycopg.errors.LockNotAvailable:
        raise
    except (psycopg.OperationalError, PoolTimeout) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"the PostgreSQL store cannot be used: {first}") from None
