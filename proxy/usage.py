"""Token usage per session, recorded from response.completed / JSON responses.

Context remaining = model window - last input_tokens - output_tokens (DESIGN §3.2).
"""

from __future__ import annotations

import fnmatch
import sqlite3
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from proxy.db import register_schema

register_schema(
    "usage",
    """
    CREATE TABLE IF NOT EXISTS usage (
        session_key TEXT PRIMARY KEY,
        task TEXT,
        agent TEXT,
        model TEXT,
        input_tokens INTEGER,
        output_tokens INTEGER,
        total_tokens INTEGER,
        response_id TEXT,
        updated_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS usage_by_agent ON usage(task, agent, updated_at);
    -- Before a session's first answer with usage: an estimate of its request (issue 29 (5)), labelled so.
    CREATE TABLE IF NOT EXISTS usage_estimates (
        session_key TEXT PRIMARY KEY,
        task TEXT,
        agent TEXT,
        model TEXT,
        input_tokens INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX IF NOT EXISTS usage_estimates_by_agent ON usage_estimates(task, agent, updated_at);
    """,
)


@dataclass(frozen=True)
class Usage:
    session_key: str
    task: str | None
    agent: str | None
    model: str | None
    input_tokens: int
    output_tokens: int
    total_tokens: int | None
    response_id: str | None
    updated_at: float


def model_window(model: str | None, windows: dict[str, int]) -> int | None:
    """The window of `model` in `windows` (the most specific pattern that matches it, `pattern_rank`). Asked
    several times per request: the answers for the table last asked of are kept (a config's table is
    replaced, never changed in place)."""
    if not model:
        return None
    memo = _WINDOW_MEMO
    if memo[0] is not windows or memo[1] != len(windows):
        memo[:] = [windows, len(windows), {}]
    found: dict[str, int | None] = memo[2]
    try:
        return found[model]
    except KeyError:
        pass
    size = None
    best: tuple[int, int] | None = None
    for pattern, n in windows.items():
        if fnmatch.fnmatchcase(model, pattern):
            rank = pattern_rank(pattern)
            if best is None or rank > best:
                best, size = rank, n
    if len(found) < _WINDOW_MEMO_MODELS:
        found[model] = size
    return size


def pattern_rank(pattern: str) -> tuple[int, int]:
    """How specific a `model_windows` pattern is: an exact name (no glob character) beats every glob, then
    the pattern with more literal characters wins; `"*"` ranks last. The table's key order does not matter
    (`ctproxy config set` saves it sorted, which puts `"*"` first); among equal ranks the first one wins."""
    literal = sum(1 for c in pattern if c not in "*?[]")
    return (0 if any(c in pattern for c in "*?[") else 1, literal)


_WINDOW_MEMO: list[Any] = [None, 0, {}]  # the table, its length then, model → window
_WINDOW_MEMO_MODELS = 256


def record_usage(conn: sqlite3.Connection, session_key: str, task: str | None, agent: str | None,
                 model: str | None, usage: dict, response_id: str | None, at: float | None = None) -> None:
    """`at` is when the answer was seen (not when a background writer got to it), so `newest` can
    compare this row with the in-process cache."""
    conn.execute(
        "INSERT INTO usage(session_key, task, agent, model, input_tokens, output_tokens, total_tokens,"
        " response_id, updated_at) VALUES (?,?,?,?,?,?,?,?,?)"
        " ON CONFLICT(session_key) DO UPDATE SET task=excluded.task, agent=excluded.agent,"
        " model=excluded.model, input_tokens=excluded.input_tokens, output_tokens=excluded.output_tokens,"
        " total_tokens=excluded.total_tokens, response_id=excluded.response_id, updated_at=excluded.updated_at"
        " WHERE excluded.updated_at >= usage.updated_at",  # a late write never replaces a newer answer
        (session_key, task, agent, model, int(usage.get("input_tokens") or 0),
         int(usage.get("output_tokens") or 0), usage.get("total_tokens"), response_id, at or time.time()),
    )


def record_estimate(conn: sqlite3.Connection, session_key: str, task: str | None, agent: str | None,
                    model: str | None, input_tokens: int, at: float | None = None) -> None:
    """An estimate of a request's input tokens, for a session no answer with usage came back for yet."""
    conn.execute(
        "INSERT INTO usage_estimates(session_key, task, agent, model, input_tokens, updated_at) VALUES (?,?,?,?,?,?)"
        " ON CONFLICT(session_key) DO UPDATE SET task=excluded.task, agent=excluded.agent, model=excluded.model,"
        " input_tokens=excluded.input_tokens, updated_at=excluded.updated_at",
        (session_key, task, agent, model, int(input_tokens), at or time.time()))


def estimate_for_agent(conn: sqlite3.Connection, task: str, agent: str) -> Usage | None:
    """The newest request estimate of the agent's sessions (a Usage with no output tokens), or None."""
    try:
        row = conn.execute("SELECT session_key, task, agent, model, input_tokens, updated_at FROM usage_estimates"
                           " WHERE task=? AND agent=? ORDER BY updated_at DESC LIMIT 1", (task, agent)).fetchone()
    except sqlite3.OperationalError:  # a state directory older than the table
        return None
    if row is None:
        return None
    return Usage(row[0], row[1], row[2], row[3], int(row[4]), 0, None, None, float(row[5]))


def _row(row: sqlite3.Row | None) -> Usage | None:
    return Usage(**dict(row)) if row is not None else None


def last_usage_for_session(conn: sqlite3.Connection, session_key: str) -> Usage | None:
    return _row(conn.execute("SELECT * FROM usage WHERE session_key=?", (session_key,)).fetchone())


def last_usage_for_agent(conn: sqlite3.Connection, task: str, agent: str) -> Usage | None:
    return _row(conn.execute(
        "SELECT * FROM usage WHERE task=? AND agent=? ORDER BY updated_at DESC LIMIT 1", (task, agent)
    ).fetchone())


class UsageCache:
    """The newest usage per session in this process, written synchronously by the tap when a
    response's terminal event passes (before the client has it), so the next request of the session
    sees it without a database round trip and without racing the background write.

    In a worker of `ctproxy up --workers N` (`db_path` given) the session's previous answer may have passed
    through another worker, whose usage is committed before that answer ended (proxy/windows/budget.py): `get`
    then also reads the session's row (one indexed SELECT on a connection of its own) and returns the newer."""

    def __init__(self, capacity: int = 10_000, db_path: Path | None = None, backend: Any = None):
        self._items: OrderedDict[str, Usage] = OrderedDict()
        self._capacity = capacity
        self._db_path = db_path
        # A shared store's UsageBackend (PostgreSQL, proxy/store/interface.py): `get` reads the session's row there
        # (`for_session`, one indexed query), since another instance may have served the session's last answer.
        self.backend = backend
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def _stored(self, session_key: str) -> Usage | None:
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = sqlite3.connect(f"file:{self._db_path}?mode=ro", uri=True, timeout=5,
                                                 check_same_thread=False)
                    self._conn.row_factory = sqlite3.Row
                return last_usage_for_session(self._conn, session_key)
            except sqlite3.Error:  # no table yet, a busy database: what this process knows is the answer
                return None

    def put(self, u: Usage) -> None:
        self._items[u.session_key] = u
        self._items.move_to_end(u.session_key)
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    def get(self, session_key: str, memo: dict[str, Usage | None] | None = None) -> Usage | None:
        """The session's newest usage: this process's, or the stored one when newer (a shared store, or another
        worker's). `memo` is one request's (`proxy.host.flowstate.FlowState.stored_usage`): the stored usage is read at
        most once per request, however many stages ask; what this process put since is always seen (`put`)."""
        mine = self._items.get(session_key)
        if self.backend is None and self._db_path is None:
            return mine
        if memo is not None and session_key in memo:
            return newest(mine, memo[session_key])
        try:
            stored = self.stored(session_key)
        except Exception:  # the store unreachable (StoreError): what this process knows is the answer
            return mine
        if memo is not None:
            memo[session_key] = stored
        return newest(mine, stored)

    def stored(self, session_key: str) -> Usage | None:
        """The session's stored usage (one indexed read), whatever this process holds: a shared store's
        `for_session`, or in a worker the state database's row."""
        if self.backend is not None:
            return self.backend.for_session(session_key)
        return self._stored(session_key) if self._db_path is not None else None


def newest(a: Usage | None, b: Usage | None) -> Usage | None:
    if a is None or b is None:
        return a or b
    return a if a.updated_at >= b.updated_at else b


def make_usage(session_key: str, task: str | None, agent: str | None, model: str | None, used: dict,
               response_id: str | None) -> Usage:
    return Usage(session_key, task, agent, model, int(used.get("input_tokens") or 0),
                 int(used.get("output_tokens") or 0), used.get("total_tokens"), response_id, time.time())


@runtime_checkable
class UsageBackend(Protocol):
    """Token usage per session (proxy/usage.py): the last answer's usage, and before any, an estimate of the request.

    Contract: `record` keeps the newest answer by `at` (when it was seen: a late write never replaces a newer one);
    `record_estimate` replaces the session's estimate; `for_agent` / `estimate_for_agent` answer the agent's newest
    session of the task, never another task's."""

    def record(self, session_key: str, task: str | None, agent: str | None, model: str | None, usage: dict,
               response_id: str | None, at: float | None = None) -> None: ...

    def record_estimate(self, session_key: str, task: str | None, agent: str | None, model: str | None,
                        input_tokens: int, at: float | None = None) -> None: ...

    def for_session(self, session_key: str) -> Usage | None: ...

    def for_agent(self, task: str, agent: str) -> Usage | None: ...

    def estimate_for_agent(self, task: str, agent: str) -> Usage | None: ...
