"""The `apply_patch` tool: arguments, the async executor and the family the registry loads."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from proxy.sandbox.bwrap import READ_ONLY, UNSANDBOXED, protected_part
from tools_server.patch.commit import LOCAL_FS, CommitReport, LocalFs
from tools_server.patch.engine import apply_patch
from tools_server.patch.model import Patch, PatchError, UpdateFile
from tools_server.patch.parser import parse_patch
from tools_server.patch.paths import WorkDir, lexical_target, working_dir
from tools_server.patch.report import details, failure_text, success_text
from tools_server.patch.spec import CUSTOM_FORMAT, DESCRIPTION, PARAMETERS
from tools_server.pathqueue import QueueWaitCancelled, shared_path_queue
from tools_server.registry import CallContext, Services, Tool, ToolError, ToolResult
from tools_server.workspace import require

MAX_PATCH_CHARS = 8 * 1024 * 1024


class ApplyPatchArgs(BaseModel):
    """`patch` is the documented field; `input` is what Codex's JSON apply_patch sent, accepted too."""

    model_config = ConfigDict(extra="forbid")

    patch: str | None = None
    input: str | None = None
    cwd: str | None = None

    @model_validator(mode="after")
    def _one_patch(self) -> ApplyPatchArgs:
        if (self.patch is None) == (self.input is None):
            raise ValueError("give the patch text in 'patch' (and not also in 'input')")
        return self

    @property
    def text(self) -> str:
        return self.patch if self.patch is not None else self.input or ""


class PatchFamily:
    name = "patch"

    def __init__(self, services: Services, fs: LocalFs = LOCAL_FS):
        self.services = services
        self.fs = fs
        self.tool = Tool(
            name="apply_patch",
            description=DESCRIPTION,
            family=self.name,
            capability="apply_patch",
            args_model=ApplyPatchArgs,
            execute=self.execute,
            parameters=PARAMETERS,
            strict=False,
            parallel=False,
            custom_format=CUSTOM_FORMAT,
        )

    def tools(self) -> Iterable[Tool]:
        return [self.tool]

    async def close(self) -> None:
        return None

    async def execute(self, args: ApplyPatchArgs, ctx: CallContext) -> ToolResult:
        root = require(self.services, "apply_patch")
        patch, cwd = self._prepare(args, ctx, root)
        keys = _queue_keys(patch, cwd)
        if self.services.config.shell.sandbox == READ_ONLY:  # the sandbox's rule: nothing in the workspace
            raise ToolError("apply_patch: the workspace is read-only under shell.sandbox read-only; nothing was "
                            "changed (`ctproxy up --sandbox workspace-write` lets patches through)",
                            code="read_only")
        if self.services.config.shell.sandbox != UNSANDBOXED:  # the sandbox's rule (issue 33): .git stays read-only
            real_root = os.path.realpath(root)
            for key in keys:
                if (part := protected_part(key, real_root)) is not None:
                    raise ToolError(f"apply_patch: '{os.path.relpath(key, real_root)}' is inside the workspace's "
                                    f"{part}, which is read-only under shell.sandbox "
                                    f"{self.services.config.shell.sandbox}; nothing was changed",
                                    code="protected_path")
        try:
            async with shared_path_queue(self.services).hold(keys, cancel=ctx.cancel):
                report = await _run_in_thread(
                    lambda cancelled: apply_patch(patch, cwd, cancelled, self.fs), ctx.cancel
                )
        except QueueWaitCancelled:
            raise ToolError("apply_patch was cancelled before any file changed", code="cancelled") from None
        except PatchError as exc:
            raise _verification_error(exc) from None
        return _result(report, cwd, root)

    def _prepare(self, args: ApplyPatchArgs, ctx: CallContext, root: Path) -> tuple[Patch, WorkDir]:
        text = args.text
        if len(text) > MAX_PATCH_CHARS:
            raise ToolError(f"apply_patch: the patch is longer than {MAX_PATCH_CHARS} characters; "
                            "split it into several calls", code="too_large")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError("apply_patch: the patch contains invalid Unicode (a lone surrogate); "
                            "send UTF-8 text", code="invalid_patch") from None
        try:
            patch = parse_patch(text)
            cwd = working_dir(root, ctx.cwd, args.cwd, patch.workdir)
        except PatchError as exc:
            raise _verification_error(exc) from None
        return patch, cwd


def _queue_keys(patch: Patch, cwd: WorkDir) -> list[str]:
    """The paths to hold in the mutation queue (lexical; preflight checks them on disk)."""
    keys = []
    try:
        for hunk in patch.hunks:
            keys.append(lexical_target(cwd, hunk.path).path)
            if isinstance(hunk, UpdateFile) and hunk.move_to is not None:
                keys.append(lexical_target(cwd, hunk.move_to).path)
    except PatchError as exc:
        raise _verification_error(exc) from None
    return keys


async def _run_in_thread(work: Callable[[Callable[[], bool]], CommitReport], cancel: asyncio.Event) -> CommitReport:
    """Run `work` in a thread; if this task is cancelled, stop it at its next check and wait for it.

    Waiting matters: the caller holds the path queue, and a commit that is under way must
    finish before another writer may touch the same files.
    """
    stop = threading.Event()

    def cancelled() -> bool:
        return stop.is_set() or cancel.is_set()

    task = asyncio.ensure_future(asyncio.to_thread(work, cancelled))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        stop.set()
        while not task.done():
            try:
                await asyncio.wait({task})
            except asyncio.CancelledError:
                continue
        raise


def _verification_error(exc: PatchError) -> ToolError:
    if exc.code == "cancelled":
        return ToolError(exc.message, code="cancelled")
    return ToolError(f"apply_patch verification failed: {exc.message}\nNothing was changed.",
                     code=exc.code, details=exc.details)


def _result(report: CommitReport, cwd: WorkDir, workspace: Path) -> ToolResult:
    shown = os.path.relpath(cwd.real, os.path.realpath(workspace))
    info: dict[str, Any] = details(report, shown)
    if report.ok:
        return ToolResult(text=success_text(report), details=info)
    return ToolResult(text=failure_text(report), details=info, is_error=True)


def create_family(services: Services) -> PatchFamily:
    return PatchFamily(services)
