"""The invocation seam (seed 004 §5.10): trusted per-call context, then policy, then execution.

Every tool call reaches it once, on the one road (tools_server/service.py): every tool, whatever road the
call came by (`transport`: rest, mcp, bridge, codex, cell, direct), direct or nested in a code cell
(`path`, with the cell's ID in `cell_id`). The env overlay `context()` returns is applied where a process
is spawned (exec_command); for the other tools only the verdict matters.

Configured by `config.shell.policy`, a dotted path (`package.module:attr` or `package.module.attr`)
to a hooks object, a class, or a zero-argument callable returning one (called once). The object may define

    context(call) -> {"env": {NAME: value}} | None      # a per-call env overlay for the spawn
    policy(call)  -> None | True | False | "reason"     # anything but None/True refuses

either plain or `async`. `call` carries control identity only, never the command text,
input or output. A hook that raises refuses the call (fail closed); nothing runs.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

from proxy.sandbox.policy import SeamConfigError, load_hooks  # noqa: F401 (the seam's loader, shared with status)
from tools_server.shell.errors import ShellError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class InvocationCall:
    tool: str  # the registry's name: exec_command, write_stdin, apply_patch, history_read_item, …
    path: Literal["direct", "nested"]
    cwd: str
    session_id: str | None = None
    cell_id: str | None = None
    task: str | None = None
    agent: str | None = None
    transport: str = "direct"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def validate_overlay(tool: str, env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, dict):
        raise ShellError(tool, "invalid-env-overlay", "the invocation hook returned an env that is not a map")
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            raise ShellError(tool, "invalid-env-overlay", "the invocation hook returned an invalid env name")
        if not isinstance(value, str) or "\x00" in value:
            raise ShellError(tool, "invalid-env-overlay",
                             f"the invocation hook returned a non-string value for {key}")
    return dict(env)


class InvocationSeam:
    """Runs the configured hooks for one call; no hooks means allow with no overlay."""

    def __init__(self, hooks: Any | None) -> None:
        self._hooks = hooks

    async def admit(self, call: InvocationCall) -> dict[str, str]:
        """context(call) then policy(call); returns the env overlay or raises a refusal."""
        if self._hooks is None:
            return {}
        tool = call.tool
        overlay: dict[str, str] = {}
        try:
            if hasattr(self._hooks, "context"):
                ctx = await _maybe_await(self._hooks.context(call))
                env = ctx.get("env") if isinstance(ctx, dict) else getattr(ctx, "env", None)
                overlay = validate_overlay(tool, env)
            if hasattr(self._hooks, "policy"):
                verdict = await _maybe_await(self._hooks.policy(call))
            else:
                verdict = None
        except ShellError:
            raise
        except Exception as exc:
            raise ShellError(tool, "policy-refused",
                             f"the invocation policy failed ({type(exc).__name__}); nothing was run") from exc
        if verdict is None or verdict is True:
            return overlay
        reason = verdict if isinstance(verdict, str) and verdict.strip() else "refused by the invocation policy"
        raise ShellError(tool, "policy-refused", f"{reason.strip()} (nothing was run; do not retry elsewhere)")
