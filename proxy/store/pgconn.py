"""A pooled PostgreSQL connection for the store's parts (proxy/store/pg.py, proxy/store/pg_journal.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from proxy.store import postgres
from proxy.store.postgres import StoreError


@contextmanager
def connection(pool: Any) -> Iterator[Any]:
    """A pooled connection; a database that cannot be reached (gone, restarted, no connection free in time) is a
    `StoreError` saying so. A lock wait that ran out (`LockNotAvailable`) is left to the caller, which words it."""
    psycopg = postgres._psycopg()
    from psycopg_pool import PoolTimeout

    try:
        with pool.connection() as conn:
            yield conn
    except psycopg.errors.LockNotAvailable:
        raise
    except (psycopg.OperationalError, PoolTimeout) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StoreError(f"the PostgreSQL store cannot be used: {first}") from None
