"""The shell family: exec_command and write_stdin, one manager (seed 004 §4.6, §5.6).

Each call: the one road (tools_server/service.py: discovery, then the invocation seam's context and
policy, told the resolved directory and session by `policy_facts` here) → dialect normaliser →
admission/ownership → the manager, which spawns with the overlay the seam gave (`ctx.env_overlay`).
Both tools share the `shell` capability switch, so they are on or off together.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from proxy.config import ShellConfig
from tools_server.registry import CallContext, Services, Tool, ToolResult, clip
from tools_server.shell import limits
from tools_server.shell.capture import CaptureStore
from tools_server.shell.dialect import EXEC, WRITE, normalize_exec, normalize_write
from tools_server.shell.errors import ShellError
from tools_server.shell.job import Delivery, Job
from tools_server.shell.manager import Observation, Owner, ShellManager, confinement_of
from tools_server.shell.render import render
from tools_server.workspace import OutsideWorkspace, inside, require


class RawArgs(BaseModel):
    """Accept any object: the dialect normaliser validates (aliases need more than a schema)."""

    model_config = ConfigDict(extra="allow")


EXEC_DESCRIPTION = (
    "Runs a shell command (`<shell> -c cmd`) with plain pipes (no PTY, so no TTY semantics; tty "
    "is refused), returning its output or a session ID for ongoing interaction with write_stdin. "
    "The command runs once and is never replayed. Output is previewed up to max_output_tokens; "
    "the full stdout/stderr is kept in private files whose paths the result names."
)
WRITE_DESCRIPTION = (
    "Writes characters to the stdin of a running exec_command session (exactly as given: add \\n "
    "yourself) and returns recent output. Empty chars polls. closeStdin sends EOF after the input; "
    "terminate stops the process group (SIGTERM, then SIGKILL after 5 s)."
)

EXEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cmd": {"type": "string", "description": "Shell command to execute."},
        "workdir": {"type": "string",
                    "description": "Working directory inside the workspace; relative paths resolve "
                                   "against the session's directory (the workspace, or x-ctp-cwd)."},
        "tty": {"type": "boolean", "description": "Must be false or omitted: sessions use pipes, not a PTY."},
        "yield_time_ms": {"type": "number",
                          "description": "How long to wait for output before yielding (250-30000, "
                                         "default 10000)."},
        "max_output_tokens": {"type": "number",
                              "description": "Maximum output tokens to return (4 bytes each; default 10000)."},
    },
    "required": ["cmd"],
    "additionalProperties": False,
}
WRITE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "session_id": {"type": ["string", "integer"],
                       "description": "Session ID of a running exec_command."},
        "chars": {"type": "string", "description": "Bytes to write to stdin (may be empty to poll)."},
        "yield_time_ms": {"type": "number",
                          "description": "How long to wait for output (writes 250-30000, default 250; "
                                         "empty polls 5000 up to the configured maximum)."},
        "max_output_tokens": {"type": "number", "description": "Maximum output tokens to return."},
        "closeStdin": {"type": "boolean", "description": "Send EOF after the accepted bytes."},
        "terminate": {"type": "boolean", "description": "Stop the session's process group."},
    },
    "required": ["session_id"],
    "additionalProperties": False,
}


def owner_of(ctx: CallContext) -> Owner:
    return (ctx.task or "", ctx.agent or "")


def _check_dir(path: Path) -> bool:
    try:
        return path.is_dir() and os.access(path, os.X_OK)
    except OSError:  # a name too long for the file system, a permission on the way
        return False


class ShellFamily:
    name = "shell"

    def __init__(self, services: Services) -> None:
        self.services = services
        cfg: ShellConfig = services.config.shell
        self.config = cfg
        self.store = CaptureStore(lambda: services.state.subdir("captures"))
        self.manager = ShellManager(self.store, shell=cfg.shell, max_jobs=cfg.max_jobs,
                                    kill_after=cfg.kill_after_ms / 1000,
                                    confinement=confinement_of(cfg, services.workspace, services.state.root))
        # code mode shares this family's capture store for its cells' output
        services.extras["shell.family"] = self

    def tools(self) -> Iterable[Tool]:
        return [
            Tool(name=EXEC, description=EXEC_DESCRIPTION, family=self.name, capability="shell",
                 args_model=RawArgs, execute=self.exec_command, parameters=EXEC_SCHEMA, parallel=True,
                 policy_facts=self.exec_facts),
            Tool(name=WRITE, description=WRITE_DESCRIPTION, family=self.name, capability="shell",
                 args_model=RawArgs, execute=self.write_stdin, parameters=WRITE_SCHEMA, parallel=True,
                 policy_facts=self.write_facts),
        ]

    async def close(self) -> None:
        await self.manager.close()

    # -- executors -----------------------------------------------------------------------------------
    def _resolve_cwd(self, workdir: str | None, ctx: CallContext) -> Path:
        """The workspace, then x-ctp-cwd, then `workdir`, each inside the workspace."""
        root = require(self.services, EXEC)
        try:
            return inside(root, ctx.cwd, os.path.expanduser(workdir) if workdir else None)
        except OutsideWorkspace as exc:
            raise ShellError(EXEC, "bad-cwd", str(exc)) from None

    def desktop_env(self) -> dict[str, str]:
        """Computer Use's private desktop (computer_use.start_xvfb), once it runs: its DISPLAY, XAUTHORITY and
        session bus, so an app a command starts appears where Computer Use looks (seed 004 defect 14)."""
        family = self.services.extras.get("computer_use.family")
        if family is None or not self.services.config.enabled("computer_use"):
            return {}
        return family.private_desktop() or {}

    async def exec_facts(self, args: RawArgs, ctx: CallContext) -> dict[str, Any]:
        """What the policy seam is told of an exec_command: the directory it would run in."""
        req = normalize_exec(args.model_extra or {})
        return {"cwd": await asyncio.to_thread(self._resolve_cwd, req.workdir, ctx)}

    async def write_facts(self, args: RawArgs, ctx: CallContext) -> dict[str, Any]:
        """What the policy seam is told of a write_stdin: the session and the directory it runs in."""
        require(self.services, WRITE)
        req = normalize_write(args.model_extra or {}, self.config.max_poll_ms)
        job = self.manager.lookup(WRITE, owner_of(ctx), req.session_id)
        return {"cwd": job.cwd, "session_id": job.id}

    async def exec_command(self, args: RawArgs, ctx: CallContext) -> ToolResult:
        started = time.monotonic()
        req = normalize_exec(args.model_extra or {})
        owner = owner_of(ctx)
        cwd = await asyncio.to_thread(self._resolve_cwd, req.workdir, ctx)
        with self.manager.admission(EXEC, owner):
            if not await asyncio.to_thread(_check_dir, cwd):
                raise ShellError(EXEC, "bad-cwd", f"workdir {clip(str(cwd))} is not an accessible directory")
            if ctx.cancel.is_set():
                raise ShellError(EXEC, "cancelled", "the call was cancelled before the command started")
            if ctx.detach is not None and ctx.detach.is_set():
                raise ShellError(EXEC, "cancelled", "the code cell that made this call has ended; nothing was run")
            job = await self.manager.start(EXEC, owner, req.cmd, cwd, {**self.desktop_env(), **ctx.env_overlay})
        with self._stop_on_cancel(job):
            return await self._observe(EXEC, job, started, started + req.yield_ms / 1000,
                                       req.max_output_bytes, ctx)

    async def write_stdin(self, args: RawArgs, ctx: CallContext) -> ToolResult:
        started = time.monotonic()
        require(self.services, WRITE)  # no workspace, no sessions: say how to set one, not "stale session"
        req = normalize_write(args.model_extra or {}, self.config.max_poll_ms)
        job = self.manager.lookup(WRITE, owner_of(ctx), req.session_id)
        if ctx.detach is not None and ctx.detach.is_set():
            raise ShellError(WRITE, "cancelled", f"the code cell that made this call has ended; nothing was "
                             f"written and session {job.id} was not read")
        deadline = started + req.yield_ms / 1000
        delivery: Delivery | None = None
        data = req.chars.encode("utf-8")
        with self._stop_on_cancel(job):
            if ctx.cancel.is_set():
                data = b""  # cancelled before sending: nothing is written, the job stops below
            if data:
                delivery = await self.manager.write(WRITE, job, data, max(0.0, deadline - time.monotonic()))
            if req.close_stdin:
                job.close_stdin()
            if req.terminate:
                await self.manager.stop(job)
                deadline = time.monotonic()  # an unconfirmed stop does not sit out a long poll
            try:
                return await self._observe(WRITE, job, started, deadline, req.max_output_bytes, ctx,
                                           delivery=delivery, input_bytes=len(data))
            except ShellError as exc:
                if exc.code != "stale-session" or (delivery is None and not req.terminate):
                    raise
                # a poll racing this call read the session's end first: what this call did still happened
                return raced(job, delivery, len(data), req.terminate)

    @contextlib.contextmanager
    def _stop_on_cancel(self, job: Job) -> Iterator[None]:
        """Cancelling a direct call stops its job (in the background: nobody awaits it any more)."""
        try:
            yield
        except asyncio.CancelledError:
            self.manager.stop_in_background(job)
            raise

    async def _observe(self, tool: str, job: Job, started: float, deadline: float, budget: int,
                       ctx: CallContext, delivery: Delivery | None = None,
                       input_bytes: int = 0) -> ToolResult:
        if await self.manager.wait(job, deadline, ctx.cancel, ctx.detach):
            await self.manager.stop(job)
        elif ctx.detach is not None and ctx.detach.is_set():
            return detached(job)
        obs: Observation = await self.manager.observe(tool, job, started, budget)
        obs.input_delivery = delivery
        obs.input_bytes = input_bytes
        text, details = render(obs)
        return ToolResult(text=text, details=details)


def raced(job: Job, delivery: Delivery | None, input_bytes: int, terminated: bool) -> ToolResult:
    """A write_stdin whose input was delivered (or whose stop was sent) while another call read the
    session's end: never a failure, which would invite a resend (seed 004 defect 13)."""
    did = []
    if delivery is not None:
        outcome = "were delivered" if delivery == "written" else f"delivery: {delivery}"
        did.append(f"{input_bytes} bytes of input {outcome}")
    if terminated:
        did.append("the stop was sent")
    details: dict[str, Any] = {"session_id": job.id, "read_by_another_call": True}
    if delivery is not None:
        details["inputDelivery"] = delivery
    if terminated:
        details["terminated"] = True
    return ToolResult(text=f"Session {job.id}: {' and '.join(did)}; the session then ended and another call "
                           "(a poll) read its final output and exit code, so they are not repeated here.",
                      details=details)


def detached(job: Job) -> ToolResult:
    """The answer of a call whose code cell ended while it waited: nothing was read, so the session's output
    and exit code are all still there for write_stdin (seed 004 §5.7: a poll returns before reading)."""
    exited = job.complete.is_set()
    state = "has exited; its output and exit code are" if exited else "is still running; its output is"
    return ToolResult(text=f"Session {job.id} {state} unread (the code cell waiting on it ended): read it with "
                           f"write_stdin session_id {job.id}.",
                      details={"session_id": job.id, "detached": True, "running": not exited, "unread": True})


def create_family(services: Services) -> ShellFamily:
    return ShellFamily(services)


__all__ = ["ShellFamily", "create_family", "limits"]
