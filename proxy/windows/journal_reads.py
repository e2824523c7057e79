"""What the window service reads back from the journal for a rollover of a stateful request (issue 29 (2)): the
calls its outputs answer, and the branch a bridged stateful turn hangs from. Off the request path (a thread):
each flushes the journal's writer first, so the last answer is there. Moved out of addons/context.py."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from proxy.windows.remote import journal_link

log = logging.getLogger("ctproxy.context")


async def journal_calls(ws: journal_link.WindowSession, call_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The journal's calls for these ids (the last answer's committed first); {} when it cannot say."""
    def read() -> dict[str, dict[str, Any]]:
        ws.journal.flush(10.0)
        return ws.journal.call_items(ws.key, call_ids)
    try:
        return await asyncio.to_thread(read)
    except Exception:  # the journal is a record: the outputs whose calls it cannot give are left out
        log.warning("context: the calls of a stateful rollover's outputs could not be read")
        return {}


LEADING_LOOKUP = 16  # the branch's first items read back for a stateful request's instructions


def tail_of(ws: journal_link.WindowSession) -> str | None:
    """The journal id of the last item on the branch after this request (its answer hangs from it)."""
    mark = ws.mark
    try:
        return mark.tail if mark is not None and not mark.failed else None
    except Exception:  # the journal is a record: the turn's items are then filed in the window current at its end
        return None


def branch_of(ws: journal_link.WindowSession) -> tuple[int, str, list[Any]] | None:
    """For a stateful request's turn: how many items the journal's branch holds after this request, the
    one-chain id of its last, and the agent's leading instructions on it; None without the journal's mark."""
    mark = ws.mark
    try:
        if mark is None or mark.failed or not mark.tail:
            return None
        branch, tail = mark.branch, mark.tail
        ws.journal.flush(10.0)
        head = [e.item_id for e in branch[:LEADING_LOOKUP]]
        return len(branch), tail, ws.journal.raw_items(head)
    except Exception:  # the journal is a record: the window is then the journal's record only
        log.warning("context: the branch of a stateful turn could not be read")
        return None
