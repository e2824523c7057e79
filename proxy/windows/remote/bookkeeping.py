"""What one compaction leaves besides its window (compaction's own records), whichever stage compacted:
compaction's threshold and overflow recovery (addons/compaction.py) or the context stage's hard trigger
and checkpoint-turn fallback (addons/context.py). The item count at the compaction (no second compaction
without new agent items), the event (for `ctproxy tasks`), a failed remote attempt (not retried for the
same items), and the journal's compaction event.

Where the records go (`shared_records`): on the embedded store, compaction's statements on the proxy's database
thread's connection, inside its batched transaction (as they always ran); on another store (`--store`), the store's
`CompactionBackend`, called on that same thread (a write that fails there is a warning, never the batch's end).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from proxy.dbworker import DBWorker
from proxy.windows.remote import journal_link
from proxy.windows.remote.journal_link import WindowSession
from proxy.windows.remote.store import Checkpoint, SessionMemo, SqliteCompaction

if TYPE_CHECKING:
    from proxy.windows.ports import WindowStore
    from proxy.windows.remote.port import CompactionBackend

log = logging.getLogger("ctproxy.compaction")


def shared_records(store: WindowStore | None) -> CompactionBackend | None:
    """The store's compaction records when the process serves from a store other than the embedded one, else
    None (the embedded store's are the same statements, run on the database thread's connection)."""
    return store.compaction() if store is not None and store.kind != "embedded" else None


def records_on(shared: CompactionBackend | None, conn: sqlite3.Connection) -> CompactionBackend:
    """The records to use on the database thread, whose connection is `conn`."""
    return shared if shared is not None else SqliteCompaction.on(conn)


def write_op(shared: CompactionBackend | None,
             fn: Callable[[CompactionBackend], Any]) -> Callable[[sqlite3.Connection], None]:
    """`fn` as a write for the database thread (its `submit`, `put_latest` or `run`)."""
    if shared is None:
        return lambda conn: fn(SqliteCompaction.on(conn))

    def guarded(_conn: sqlite3.Connection) -> None:
        try:
            fn(shared)
        except Exception as exc:
            log.warning("compaction: a record was not written to the store (%s)", type(exc).__name__)
    return guarded


async def record_compaction(db: DBWorker, memo: SessionMemo | None, session_key: str,
                            windows: WindowSession | None, cp: Checkpoint, client_items: int, boundary: int,
                            remote_tried: bool, records: CompactionBackend | None = None) -> None:
    """`session_key`: compaction's key of the session (the request's session identity); `remote_tried`:
    the remote endpoint was called (a fallback checkpoint then means that call failed); `records`: the store's
    records (`shared_records`), None on the embedded store."""
    strategy = cp.strategy

    def save(conn: sqlite3.Connection) -> None:
        rec = records_on(records, conn)
        rec.record_compacted(session_key, client_items)
        rec.record_event(session_key, "compaction", strategy, cp.reason, cp.id)
        if strategy == "fallback" and remote_tried:
            rec.mark_failed(session_key, client_items)

    if memo is not None:
        memo.forget(session_key)  # what the memo mirrors changed: read it back next time
    await db.run(save)
    journal_link.record_event(windows, "compaction", {"checkpoint_id": cp.id, "strategy": strategy,
                                                      "reason": cp.reason, "boundary": boundary,
                                                      "window_id": cp.window_id})
