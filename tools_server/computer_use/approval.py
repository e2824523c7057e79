"""Per-app approval (seed 004 §4.5): `confirm` asks once per app per caller for the server's lifetime, `always`
does not ask.

Grants live in memory only (a set per caller, for the tool-server lifetime) and are never persisted.
A caller that cannot be asked (REST, or an MCP client without elicitation) gets `approval-unavailable`
before anything is done to the app.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Literal

from tools_server.registry import ConfirmAnswer

Answer = ConfirmAnswer
# Asks the human behind the calling client one yes/no question; returns their answer.
Confirm = Callable[[str], Awaitable[Answer]]


def confirm_from(ctx: Any) -> Confirm | None:
    """The calling transport's way to ask the user, when it has one (`CallContext.confirm`, set by the MCP
    endpoint for clients that declared the elicitation capability); None for REST and the bridge."""
    return getattr(ctx, "confirm", None)


def approval_message(app: str) -> str:
    return (f"Allow ctproxy Computer Use to read and control the app '{app}' for the rest of this tool-server "
            "session? It can see its window and click, type, press keys and scroll in it.")


class Approvals:
    """Which apps a person accepted, per caller (seed 004 defect 16): a grant given through one caller (an
    MCP session that could ask) is that caller's only; another MCP session, or a REST caller that can never
    be asked, is not covered by it. `for_caller(key)` is the view one call uses (its `granted`, `has_grant`
    and `grant` are that caller's); the key is tool discovery's (the session, else the task and agent)."""

    def __init__(self, mode: Literal["confirm", "always"], caller: str = "",
                 grants: dict[str, set[str]] | None = None):
        self.mode = mode
        self.caller = caller
        self._grants: dict[str, set[str]] = {} if grants is None else grants

    def for_caller(self, caller: str) -> Approvals:
        return Approvals(self.mode, caller, self._grants)

    def granted(self, app: str) -> bool:
        return self.mode == "always" or self.has_grant(app)

    def has_grant(self, app: str) -> bool:
        """Accepted earlier in this run by this caller (not just allowed by the mode)."""
        return app in self._grants.get(self.caller, ())

    def grant(self, app: str) -> None:
        self._grants.setdefault(self.caller, set()).add(app)

    def clear(self) -> None:
        self._grants.clear()


def mcp_confirm_for(request_ctx: Any) -> Confirm | None:
    """The Confirm for one MCP tool call: asks through form elicitation when the client declared the
    capability and this request's channel can carry a server-initiated request (streamable HTTP with SSE
    answers; not the JSON-only answer mode). None otherwise, so the caller reports approval-unavailable.
    The MCP endpoint sets `CallContext.confirm` from this."""
    session = getattr(request_ctx, "session", None)
    caps = getattr(session, "client_capabilities", None)
    if session is None or caps is None or getattr(caps, "elicitation", None) is None:
        return None
    if not getattr(session, "can_send_request", False):
        return None
    related = getattr(request_ctx, "request_id", None)

    async def confirm(message: str) -> Answer:
        result = await session.elicit_form(message, {"type": "object", "properties": {}}, related_request_id=related)
        action = getattr(result, "action", "decline")
        return action if action in ("accept", "decline", "cancel") else "decline"

    return confirm
