"""Classified shell errors: short text for the model plus a stable code for clients."""

from __future__ import annotations

from typing import Literal

from tools_server.registry import ToolError

ShellErrorCode = Literal[
    "invalid-arguments",
    "conflicting-alias",
    "unsupported-field",
    "tty-unsupported",
    "bad-cwd",
    "spawn-failed",
    "argument-too-long",
    "job-cap",
    "stale-session",
    "stdin-closed",
    "stdin-failed",
    "stdin-overload",
    "policy-refused",
    "invalid-env-overlay",
    "cancelled",
    "owner-closed",
    "cleanup-incomplete",
]


class ShellError(ToolError):
    def __init__(self, tool: str, code: ShellErrorCode, message: str, details: dict | None = None):
        super().__init__(f"{tool} failed: {message}", code=code, details=details)
        self.tool = tool
