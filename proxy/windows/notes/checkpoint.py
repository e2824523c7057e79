"""A manual checkpoint (seed 000's `/compact`): which agent it names, and marking it pending.

Used by `ctproxy context checkpoint` and the tool server's `POST /v1/context/checkpoint`. The target is resolved
through the store's journal and the mark is made through its rollovers (proxy/store/interface.py), so with
`--store postgresql://…` a checkpoint asked of one instance is taken by whichever instance serves the agent's
next request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.errors import CtproxyError
from proxy.items.addresses import AddressError, resolve_address
from proxy.windows.notes.pending import Pending

if TYPE_CHECKING:
    from proxy.journal.port import JournalBackend
    from proxy.windows.ports import WindowStore


class CheckpointTargetError(CtproxyError, ValueError):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def checkpoint_target(journal: JournalBackend, session: str | None, task: str | None,
                      agent: str | None) -> tuple[str, str]:
    """(task, agent address) a manual checkpoint names: a journal session key, or a task and an agent
    (relative names under /root; the task's root when no agent is given)."""
    if session:
        found = journal.session(session)
        if found is None:
            raise CheckpointTargetError("unknown_session", f"unknown session {session!r}: see `ctproxy tasks`")
        return found[0], found[1]
    if not task:
        raise CheckpointTargetError("invalid_arguments", "name a session, or a task (and an agent)")
    try:
        address = resolve_address(agent)
    except AddressError as exc:
        raise CheckpointTargetError("invalid_agent", f"agent: {exc}") from None
    if not journal.task_exists(task):
        raise CheckpointTargetError("unknown_task", f"unknown task {task!r}")
    if not journal.agent_exists(task, address):
        known = ", ".join(journal.history().agents(task)) or "none"
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


def mark_checkpoint(store: WindowStore, session: str | None, task: str | None, agent: str | None,
                    origin: str, config: Any = None) -> Pending:
    """Mark the agent so its next request runs the checkpoint turn and rolls over (seed 000: `/compact`), in
    `store` (the process's: the target from its journal, the mark through its rollovers). With `config` (the
    running configuration), a checkpoint it cannot serve is refused with the reason."""
    if config is not None and (why := refusal(config)) is not None:
        raise why
    journal = store.journal()
    task_id, address = checkpoint_target(journal, session, task, agent)
    window = journal.history().current_window(task_id, address)
    return store.rollovers.mark(task_id, address, "checkpoint", origin, window)
