"""SQLite in WAL mode: one database in the state directory shared by every process.

Modules that own tables register their schema with `register_schema`; `connect` applies every
registered schema (idempotent `CREATE … IF NOT EXISTS`) once per process and database path.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

_SCHEMAS: dict[str, str] = {}
_applied: set[tuple[str, str]] = set()
_lock = threading.Lock()


def register_schema(name: str, ddl: str) -> None:
    _SCHEMAS[name] = ddl


def connect(path: Path, *, readonly: bool = False) -> sqlite3.Connection:
    """Open a connection with WAL, a busy timeout, and every registered schema applied."""
    path.parent.mkdir(parents=True, exist_ok=True)
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = sqlite3.connect(uri, uri=True, timeout=30, isolation_level=None, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA busy_timeout=30000")
    if not readonly:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        with _lock:
            for name, ddl in _SCHEMAS.items():
                key = (str(path), name)
                if key not in _applied:
                    conn.executescript(ddl)
                    _applied.add(key)
    return conn
