"""One background thread with its own SQLite connection, so database work never blocks the event loop."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from proxy.db import connect

T = TypeVar("T")


class DBWorker:
    def __init__(self, path: Path):
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctproxy-db")
        self._conn: sqlite3.Connection | None = None

    def _with_conn(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            self._conn = connect(self.path)
        return fn(self._conn)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._with_conn, fn)

    def submit(self, fn: Callable[[sqlite3.Connection], object]) -> None:
        """Fire and forget (errors are swallowed by the future; use `run` to observe them)."""
        self._pool.submit(self._with_conn, fn)

    def close(self) -> None:
        def _close() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        self._pool.submit(_close)
        self._pool.shutdown(wait=True)
