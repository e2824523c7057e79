"""Which task, agent and journal session a request belongs to (pure apart from the task lookup).

- `x-ctp-task: <id>` joins that task (it must exist); `x-ctp-agent` names the agent (relative names
  are under `/root`), and an agent without a name gets `/root/agent_<hash>` of its own conversation
  key. The journal session of a joined agent is `a:<hash(task, address)>`: one per agent.
- Anything else starts, or by its session key continues, its own task (`task_<hash(session key)>`,
  so every process agrees) with the agent `/root` (or `x-ctp-agent`).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from proxy.errors import CtproxyError
from proxy.items.addresses import ROOT, AddressError, auto_address, resolve_address
from proxy.items.canonical import sha256
from proxy.session import SessionIdentity, resolve_session


class JoinError(CtproxyError):
    """A request that may not be forwarded: unknown task, invalid agent address (HTTP 400)."""

    def __init__(self, code: str, message: str, status: int = 400):
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": None,
                          "code": self.code}}


def _h(*parts: str) -> str:
    return sha256("\x00".join(parts).encode("utf-8")).hexdigest()


@lru_cache(maxsize=4096)  # every request of a session asks again
def auto_task_id(session_key: str) -> str:
    """The task a session without x-ctp-task starts: stable, so every process agrees on it."""
    return "task_" + _h("task", session_key)[:16]


def new_task_id() -> str:
    return "task_" + secrets.token_hex(8)


def resolve_identity(identity: SessionIdentity, headers: Mapping[str, str], payload: Mapping[str, Any],
                     task_exists: Callable[[str], bool]) -> tuple[str, str, str]:
    """(journal session key, task id, agent address) of a request; raises JoinError."""
    try:
        if identity.task:
            if identity.agent:
                address = resolve_address(identity.agent)
            else:
                # Agents without a name are told apart by their own conversation signals.
                inner = resolve_session({k: v for k, v in headers.items()
                                         if not k.lower().startswith("x-ctp-")}, payload)
                address = auto_address(inner.session_key)
            if not task_exists(identity.task):
                raise JoinError("unknown_task", f"unknown task {identity.task!r} in x-ctp-task: create one "
                                "with `ctproxy task new`, or omit x-ctp-task to start a new task")
            return "a:" + _h(identity.task, address)[:24], identity.task, address
        address = resolve_address(identity.agent) if identity.agent else ROOT
    except AddressError as exc:
        raise JoinError("invalid_agent", f"x-ctp-agent: {exc}") from None
    return identity.session_key, auto_task_id(identity.session_key), address
