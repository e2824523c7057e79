"""The errors a Computer Use tool answers with: a stable code the model (and tests) can act on."""

from __future__ import annotations

from tools_server.registry import ToolError


class ComputerUseError(ToolError):
    """Codes: app-not-found, ambiguous-app, app-closed, approval-unavailable, approval-declined,
    state-required, stale-element, bad-target, focus-lost, bad-key, outcome-unknown, cancelled,
    backend-unavailable, node-repl-unavailable, app-server-exited, timeout, bad-image, action-failed."""

    def __init__(self, tool: str, code: str, message: str, details: dict | None = None):
        super().__init__(f"{tool}: {message}", code=code, details=details)
        self.tool = tool
