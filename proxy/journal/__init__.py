"""The history journal: tasks, agents, sessions, windows and items of every Responses exchange.

`Journal` (journal.py) is the facade; `journal_for(state)` gives the process-wide instance for a
state directory. Read-side queries for the history tools are in `query.py`.
"""

from __future__ import annotations

import threading

from proxy.journal.backlog import RequestMark
from proxy.journal.identity import JoinError
from proxy.journal.journal import Journal, SessionState, Window
from proxy.journal.model import COMPACTION_STRATEGIES, Strategy
from proxy.journal.writer import JournalBackendLike
from proxy.state import StateDir

__all__ = ["COMPACTION_STRATEGIES", "JoinError", "Journal", "RequestMark", "SessionState", "Strategy", "Window",
           "journal_for"]

_instances: dict[str, Journal] = {}
_lock = threading.Lock()


def journal_for(state: StateDir, cache_bytes: int | None = None, backend: JournalBackendLike | None = None) -> Journal:
    """One journal (one writer thread) per state directory and process; `cache_bytes` (config
    `history.cache_mb`) bounds what its caches hold, the last value given wins. `backend`: where it lives, the
    process's store's journal (`Runtime.state_store().journal()`); None is the embedded one of `state`."""
    key = str(state.root)
    with _lock:
        j = _instances.get(key)
        if j is None:
            j = _instances[key] = Journal(state, backend=backend)
        if cache_bytes is not None:
            j.cache_bytes = cache_bytes
        return j


def close_all() -> None:
    with _lock:
        for j in _instances.values():
            j.close()
        _instances.clear()
