"""What one compaction leaves besides its window (compaction's own records), whichever stage compacted:
compaction's threshold and overflow recovery (addons/compaction.py) or the context stage's hard trigger
and checkpoint-turn fallback (addons/context.py). The item count at the compaction (no second compaction
without new agent items), the event (for `ctproxy tasks`), a failed remote attempt (not retried for the
same items), and the journal's compaction event.
"""

from __future__ import annotations

import sqlite3

from proxy.compaction import journal_link, store
from proxy.compaction.journal_link import WindowSession
from proxy.compaction.store import Checkpoint, SessionMemo
from proxy.dbworker import DBWorker


async def record_compaction(db: DBWorker, memo: SessionMemo | None, session_key: str,
                            windows: WindowSession | None, cp: Checkpoint, client_items: int, boundary: int,
                            remote_tried: bool) -> None:
    """`session_key`: compaction's key of the session (the request's session identity); `remote_tried`:
    the remote endpoint was called (a fallback checkpoint then means that call failed)."""
    strategy = cp.strategy

    def save(conn: sqlite3.Connection) -> None:
        store.record_compacted(conn, session_key, client_items)
        store.record_event(conn, session_key, "compaction", strategy, cp.reason, cp.id)
        if strategy == "fallback" and remote_tried:
            store.mark_failed(conn, session_key, client_items)

    if memo is not None:
        memo.forget(session_key)  # what the memo mirrors changed: read it back next time
    await db.run(save)
    journal_link.record_event(windows, "compaction", {"checkpoint_id": cp.id, "strategy": strategy,
                                                      "reason": cp.reason, "boundary": boundary,
                                                      "window_id": cp.window_id})
