"""A manual checkpoint (seed 000's `/compact`): which agent it names, and marking it pending.

Used by `ctproxy context checkpoint` and the tool server's `POST /v1/context/checkpoint`.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from proxy.context import rollover
from proxy.errors import CtproxyError
from proxy.journal.addresses import AddressError, resolve_address
from proxy.journal.query import HistoryReader


def current_window(conn: sqlite3.Connection, task_id: str, address: str) -> str | None:
    """The agent's newest window id, if the journal has one."""
    row = conn.execute("SELECT window_id FROM journal_windows WHERE task_id=? AND address=?"
                       " ORDER BY created_at DESC, ordinal DESC LIMIT 1", (task_id, address)).fetchone()
    return row[0] if row else None


class CheckpointTargetError(CtproxyError, ValueError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def checkpoint_target(conn: sqlite3.Connection, session: str | None, task: str | None,
                      agent: str | None) -> tuple[str, str]:
    """(task, agent address) a manual checkpoint names: a journal session key, or a task and an agent
    (relative names under /root; the task's root when no agent is given)."""
    if session:
        row = conn.execute("SELECT task_id, address FROM journal_sessions WHERE session_key=?",
                           (session,)).fetchone()
        if row is None:
            raise CheckpointTargetError("unknown_session", f"unknown session {session!r}: see `ctproxy tasks`")
        return row[0], row[1]
    if not task:
        raise CheckpointTargetError("invalid_arguments", "name a session, or a task (and an agent)")
    try:
        address = resolve_address(agent)
    except AddressError as exc:
        raise CheckpointTargetError("invalid_agent", f"agent: {exc}") from None
    reader = HistoryReader(conn)
    if not reader.task_exists(task):
        raise CheckpointTargetError("unknown_task", f"unknown task {task!r}")
    if not reader.agent_exists(task, address):
        known = ", ".join(reader.agents(task)) or "none"
        raise CheckpointTargetError("unknown_agent", f"agent {address!r} is not registered in task {task!r}; "
                                    f"registered agents: {known}")
    return task, address


def refusal(config: Any) -> CheckpointTargetError | None:
    """Why no manual checkpoint can be served with `config` (said when it is marked, never left pending for
    ever): context off, or the notes strategy with notes off (the turn has no note to write)."""
    if not config.context.enabled:
        return CheckpointTargetError("context_off", "context is off (context.enabled false): no checkpoint can "
                                     "run; `ctproxy config set context.enabled true`, then restart ctproxy")
    if config.context.strategy == "notes" and not config.notes.enabled:
        return CheckpointTargetError("notes_off", "notes are off (notes.enabled false): the checkpoint turn has no "
                                     "note to write; enable notes, or set context.strategy remote or fallback")
    return None


def mark_checkpoint(conn: sqlite3.Connection, session: str | None, task: str | None, agent: str | None,
                    origin: str, config: Any = None) -> rollover.Pending:
    """Mark the agent so its next request runs the checkpoint turn and rolls over (seed 000: `/compact`).
    With `config` (the running configuration), a checkpoint it cannot serve is refused with the reason."""
    if config is not None and (why := refusal(config)) is not None:
        raise why
    task_id, address = checkpoint_target(conn, session, task, agent)
    rollover.ensure(conn)
    return rollover.mark_pending(conn, task_id, address, "checkpoint", origin, current_window(conn, task_id, address))
