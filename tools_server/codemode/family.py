"""The code-mode family: `exec` starts a JavaScript cell in a fresh V8 isolate, `wait` continues or stops it.

A cell may call, as `await tools.<name>(args)`, the seed's adapters (`exec_command`, `write_stdin`,
`apply_patch`) and the read-only history and notes tools. Each nested call takes the one road every call
takes (tools_server/service.py: discovery, the policy seam told the cell's ID, the journal, the same
schema validation, shell manager, patch executor and path queue as a direct call), looked up again when
it is dispatched, so a tool switched off later is refused inside a running cell too.
Off by default (`code_mode.enabled`): it is remote code execution for whoever holds the token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tools_server.codemode.cells import Cell, CellManager, Owner
from tools_server.codemode.limits import CellLimits
from tools_server.codemode.pragma import PragmaError, parse_pragma
from tools_server.codemode.process import ProcessEngine, WorkerPool
from tools_server.codemode.render import output_budget, render
from tools_server.patch.model import PatchError
from tools_server.patch.parser import parse_patch
from tools_server.registry import (
    CallContext,
    ConfirmAnswer,
    Registry,
    Services,
    Tool,
    ToolError,
    ToolResult,
    clip,
)
from tools_server.service import SERVICE_KEY, ToolService
from tools_server.shell import limits as shell_limits
from tools_server.shell.capture import StreamCapture, save_text

SEED_ADAPTERS = ("exec_command", "write_stdin", "apply_patch")
READ_ONLY_FAMILIES = ("history", "notes")
REGISTRY_KEY = "registry"  # services.extras: the registry, set by tools_server.families once built
BOOT_WAIT_S = 60.0  # at most this long for a cell's engine to start before its yield time runs
SHELL_FAMILY_KEY = "shell.family"  # services.extras: the shell family (its capture store)

EXEC_DESCRIPTION = """Runs JavaScript in a fresh V8 isolate (an async function body: top-level await and \
return work) and returns what it printed. No fetch, require, process, import() or timers; variables do \
not survive between cells. `print(...)`, `console.log/warn/error(...)` and `text(value)` write output; \
`return value` adds it as the cell's result (JSON). Nested tools, each returning a Promise of \
{ok, output, ...details} or rejecting with an Error that has .code:
- tools.exec_command({cmd, workdir?, yield_time_ms?, max_output_tokens?}): run a shell command
- tools.write_stdin({session_id, chars?, yield_time_ms?, max_output_tokens?, closeStdin?, terminate?})
- tools.apply_patch({patch}): apply a Codex-format patch (may need confirmation)
- tools.history_list_windows / history_list_items / history_read_item / history_search_contents and
  tools.notes_list_files_by_prefix / notes_read_file / notes_search_contents: the read-only history and
  notes tools, with their own arguments
`uses` lists the tools the cell may call (omitted: every one enabled now; []: none). A first line
`// @exec: {"yield_time_ms": N, "max_output_tokens": M}` sets the yield and output budget. If the cell \
is still running after yield_time_ms (default 10000) the answer carries its cell ID: continue with \
`wait`. Per cell: at most 16 nested calls outstanding, 256 KiB of arguments in all."""

WAIT_DESCRIPTION = ("Waits for a running exec cell (by cell_id) up to yield_time_ms and returns what it "
                    "printed since the last look; terminate: true stops it. A finished cell's result is "
                    "returned once.")

GRAMMAR = r"""start: pragma? source
pragma: /[ \t]*\/\/[ \t]*@exec:[^\n]*\n/
source: /[\s\S]+/
"""

EXEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "code": {"type": "string", "description": "JavaScript source (an async function body)."},
        "uses": {"type": "array", "items": {"type": "string"},
                 "description": "Tools the cell may call; omitted: all enabled ones; []: none."},
        "yield_time_ms": {"type": "integer", "description": "How long to wait before yielding (250-30000, "
                                                            "default 10000)."},
        "max_output_tokens": {"type": "integer", "description": "Output budget (4 bytes per token; default 10000)."},
    },
    "required": ["code"],
    "additionalProperties": False,
}
WAIT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "cell_id": {"type": "string", "description": "The cell ID an exec answer named."},
        "yield_time_ms": {"type": "integer", "description": "How long to wait (250-30000, default 10000)."},
        "max_tokens": {"type": "integer", "description": "Output budget (4 bytes per token; default 10000)."},
        "terminate": {"type": "boolean", "description": "Stop the cell."},
    },
    "required": ["cell_id"],
    "additionalProperties": False,
}


class ExecArgs(BaseModel):
    """`code` is the documented field; `input` is what a freeform (custom) exec call carries through the
    bridge (the raw JavaScript the grammar admitted), accepted too."""

    model_config = ConfigDict(extra="forbid")

    code: str | None = None
    input: str | None = None
    uses: list[str] | None = None
    yield_time_ms: int | None = Field(None, ge=0)
    max_output_tokens: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_source(self) -> ExecArgs:
        if (self.code is None) == (self.input is None):
            raise ValueError("give the JavaScript in 'code' (and not also in 'input')")
        return self

    @property
    def source(self) -> str:
        return self.code if self.code is not None else self.input or ""


class WaitArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    cell_id: str = Field(max_length=64)
    yield_time_ms: int | None = Field(None, ge=0)
    max_tokens: int | None = Field(None, ge=0)
    terminate: bool = False


def patch_question(cell_id: str, patch: Any) -> str:
    """What the person is asked: which cell, and which files the patch would add, change or delete."""
    hunks = getattr(patch, "hunks", None) or []
    paths = [str(getattr(h, "path", "?")) for h in hunks]
    listed = ", ".join(clip(p, 120) for p in paths[:10]) + (f" and {len(paths) - 10} more" if len(paths) > 10 else "")
    return (f"Allow ctproxy code cell {cell_id} to apply a patch to {listed or 'the workspace'}? "
            "It was written by a script the model runs; nothing is changed unless you accept.")


def owner_of(ctx: CallContext) -> Owner:
    return (ctx.task or "", ctx.agent or "")


def is_adapter(tool: Tool) -> bool:
    return tool.name in SEED_ADAPTERS or (tool.family in READ_ONLY_FAMILIES and tool.read_only)


async def _first(a: asyncio.Event, b: asyncio.Event, timeout: float) -> None:
    waits = {asyncio.ensure_future(a.wait()), asyncio.ensure_future(b.wait())}
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _yield_seconds(value: int | None) -> float:
    ms = shell_limits.EXEC_YIELD_DEFAULT_MS if value is None else value
    return min(max(ms, shell_limits.EXEC_YIELD_MIN_MS), shell_limits.EXEC_YIELD_MAX_MS) / 1000


def _budget(tokens: int | None) -> int:
    return (shell_limits.DEFAULT_MAX_OUTPUT_TOKENS if tokens is None else tokens) * shell_limits.BYTES_PER_TOKEN


class CodeModeFamily:
    name = "code_mode"

    def __init__(self, services: Services, limits: CellLimits | None = None):
        self.services = services
        cfg = services.config.code_mode
        self.limits = limits or CellLimits(memory_limit_bytes=cfg.memory_limit_mb * 1024 * 1024)
        # each cell's isolate runs in a worker process whose kernel limits bound every allocation (ArrayBuffers
        # included) and its CPU time (process.py); its tool calls still come back here, to the one road
        self.pool = WorkerPool(self.limits.memory_limit_bytes, self.limits.max_cpu_time_s)
        self.manager = CellManager(self.limits, self.dispatch, lambda: ProcessEngine(self.pool), self._capture)
        # Approval of a nested apply_patch is asked through the call observing the cell now (exec or wait):
        # its client and its open request are the only channel to a person. Cell ID -> that call's asker.
        self._askers: dict[str, Callable[[str], Awaitable[ConfirmAnswer]]] = {}
        # Cell ID -> one event per question open for it, set once answered (the observer waits for them).
        self._asking: dict[str, set[asyncio.Event]] = {}
        self._background: set[asyncio.Task[Any]] = set()  # stopping the shells of a cell nobody can name

    def _capture(self, cell_id: str) -> StreamCapture | None:
        """Cell output shares the shell family's capture store (one private folder per server session)."""
        shell = self.services.extras.get(SHELL_FAMILY_KEY)
        store = getattr(shell, "store", None)
        if store is None:
            return None
        return StreamCapture(store, f"cell-{cell_id}-output", on_room=lambda: None,
                             prefix_budget=self.limits.output_preview_bytes)

    # -- the registry, as it is now ---------------------------------------------------------------
    def _registry(self) -> Registry:
        registry = self.services.extras.get(REGISTRY_KEY)
        if registry is None:
            raise ToolError("code mode has no tool registry", code="internal_error")
        return registry

    def admitted(self) -> list[str]:
        """The adapters a cell started now may call: the adapter tools enabled now."""
        return sorted(t.name for t in self._registry().enabled_tools() if is_adapter(t))

    def adapter_names(self) -> list[str]:
        return sorted(t.name for t in self._registry().all_tools() if is_adapter(t))

    # -- nested dispatch ----------------------------------------------------------------------------
    async def dispatch(self, name: str, args: dict[str, Any], cell: Cell) -> ToolResult:
        tool = self._registry().get(name)  # again at dispatch: a tool switched off since is refused
        if tool is None or not is_adapter(tool):
            raise ToolError(f"tools.{name} is not enabled any more; nothing was run", code="unavailable")
        outer: CallContext | None = cell.context
        ctx = CallContext(services=self.services, task=outer.task if outer else None,
                          agent=outer.agent if outer else None, session=outer.session if outer else None,
                          window=outer.window if outer else None, cwd=outer.cwd if outer else None,
                          call_id=f"{cell.id}/{len(cell.calls)}", transport="cell", cell_id=cell.id,
                          detach=cell.done)  # the cell's end: a shell call returns unread, a question is withdrawn
        if name == "apply_patch" and self.services.config.code_mode.approval_mode == "confirm":
            async def approve(_tool: Tool, parsed: Any) -> None:
                # a wrong patch is an argument error, not a question for the user ...
                try:
                    patch = parse_patch(getattr(parsed, "text", ""))
                except PatchError as exc:
                    raise ToolError(f"apply_patch: {exc}; nothing was changed", code="invalid_patch") from None
                # ... then ask the person behind the observing call (MCP clients with elicitation); nobody to
                # ask (REST, the bridge, an MCP client without it) refuses before any change.
                await self._approve_patch(cell, patch)

            ctx.gate = approve  # on the road, after the policy seam: nobody is asked for what it refuses
        return await self._service().call(name, args, ctx)

    def _service(self) -> ToolService:
        service = self.services.extras.get(SERVICE_KEY)
        if service is None:  # a family used without the app (tests): the same road, with no journal
            service = ToolService(self.services, self._registry())
        return service

    async def _approve_patch(self, cell: Cell, patch: Any) -> None:
        outer = cell.context
        confirm = self._askers.get(cell.id) or (outer.confirm if isinstance(outer, CallContext) else None)
        if confirm is None:
            raise ToolError("apply_patch inside a code cell needs confirmation (code_mode.approval_mode is "
                            "'confirm') and this client cannot be asked (that needs an MCP client with "
                            "elicitation); nothing was changed. Call apply_patch directly, or set "
                            "code_mode.approval_mode to 'always'.", code="approval-unavailable")
        stopped = ToolError(f"apply_patch inside code cell {cell.id} was not applied: the cell was stopped "
                            "while the question was open; nothing was changed", code="cell-stopped")
        answered = asyncio.Event()
        self._asking.setdefault(cell.id, set()).add(answered)
        asking = asyncio.ensure_future(confirm(patch_question(cell.id, patch)))
        ended = asyncio.ensure_future(cell.done.wait())
        try:
            # a cell stopped while its question is open cancels the question: its answer can change nothing
            await asyncio.wait({asking, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not asking.done():
                asking.cancel()
            open_ = self._asking.get(cell.id, set())
            open_.discard(answered)
            if not open_:
                self._asking.pop(cell.id, None)
            answered.set()
        if asking.cancelled() or cell.state != "running":
            raise stopped
        if (exc := asking.exception()) is not None:  # the call that could ask has ended, or the client failed
            raise ToolError(f"apply_patch inside a code cell needs confirmation and asking failed "
                            f"({type(exc).__name__}: the call observing the cell may have returned); nothing was "
                            "changed. Call apply_patch directly, or retry it from a cell.",
                            code="approval-unavailable")
        answer = asking.result()
        if answer != "accept":
            raise ToolError(f"apply_patch inside a code cell was not approved (the answer was '{answer}'); "
                            "nothing was changed", code="approval-declined")

    # -- executors ----------------------------------------------------------------------------------
    async def exec_(self, args: ExecArgs, ctx: CallContext) -> ToolResult:
        try:
            pragma = parse_pragma(args.source, args.yield_time_ms, args.max_output_tokens)
        except PragmaError as exc:
            raise ToolError(f"exec: {exc}; nothing was run", code="invalid-pragma") from None
        if len(pragma.source.encode("utf-8", "replace")) > self.limits.max_code_bytes:
            raise ToolError(f"exec: the code is longer than {self.limits.max_code_bytes} bytes; nothing was run",
                            code="too_large")
        if not pragma.source.strip():
            raise ToolError("exec: there is no code to run", code="invalid_arguments")
        admitted = self.admitted()
        if args.uses is None:
            adapters = frozenset(admitted)
        else:
            known = set(self.adapter_names())
            if unknown := [n for n in args.uses if n not in known]:
                raise ToolError(f"exec: `uses` names {', '.join(clip(n, 60) for n in unknown[:5])}, which a cell "
                                f"cannot call; a cell may call: {', '.join(sorted(known))}. Nothing was run",
                                code="unknown-adapter")
            if off := [n for n in args.uses if n not in admitted]:
                raise ToolError(f"exec: `uses` names {', '.join(off[:5])}, which is not enabled now; "
                                "nothing was run", code="unavailable")
            adapters = frozenset(args.uses)
        cell = self.manager.start(owner_of(ctx), pragma.source, adapters, ctx)
        try:
            # the yield time is the program's: starting its worker process (process.py) does not count
            await _first(cell.running_code, cell.done, BOOT_WAIT_S)
            return await self._observe(cell, _yield_seconds(pragma.yield_time_ms), _budget(pragma.max_output_tokens),
                                       ctx.confirm)
        except asyncio.CancelledError:
            cell.terminate()  # nobody learnt the cell's ID: stop it, and the shells it started (nobody can name
            self._spawn(self._stop_shells_of(cell, owner_of(ctx)))  # them either: seed004 N6)
            raise

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _stop_shells_of(self, cell: Cell, owner: Owner) -> None:
        await cell.settle()  # its shell calls come back (detached) with their session IDs
        shell = self.services.extras.get(SHELL_FAMILY_KEY)
        manager = getattr(shell, "manager", None)
        if manager is None:
            return
        for sid, state in list(cell.shells.items()):
            if state != "closed":
                await manager.abandon(owner, sid)

    async def wait(self, args: WaitArgs, ctx: CallContext) -> ToolResult:
        cell = self.manager.lookup(owner_of(ctx), args.cell_id)
        if cell is None:
            if (why := self.manager.why_gone(owner_of(ctx), args.cell_id)) is not None:
                raise ToolError(f"wait: cell {clip(args.cell_id, 64)}: {why}", code="unknown-cell")
            raise ToolError(f"wait: no running or unread cell of yours has the ID {clip(args.cell_id, 64)!r} "
                            "(a finished cell's result is returned once; cells belong to the task and agent "
                            "that started them)", code="unknown-cell")
        if args.terminate:
            await cell.stop()  # what it printed before the stop is kept (a CPU loop, a long synchronous run)
            return await self._observe(cell, 0.0, _budget(args.max_tokens), ctx.confirm)
        return await self._observe(cell, _yield_seconds(args.yield_time_ms), _budget(args.max_tokens), ctx.confirm)

    async def _observe(self, cell: Cell, yield_s: float, budget: int,
                       confirm: Callable[[str], Awaitable[ConfirmAnswer]] | None = None) -> ToolResult:
        async with cell.observe_lock:  # one observer at a time; one of them gets the terminal result
            if confirm is not None:
                self._askers[cell.id] = confirm
            try:
                await self._await_cell(cell, yield_s)
            finally:
                if self._askers.get(cell.id) is confirm:
                    self._askers.pop(cell.id, None)
            if cell.state != "running":
                await cell.settle()  # its dispatched calls come back (told by `detach`) before it is reported
            if cell.id not in self.manager.cells:
                raise ToolError(f"wait: cell {cell.id}'s result was already returned", code="unknown-cell")
            output = cell.output.read_unread()
            saved = await self._recover(cell, output, budget)
            text, details = render(cell, budget, output, saved)
            if cell.state != "running":
                self.manager.mark_read(cell)
            return ToolResult(text=text, details=details, is_error=cell.state == "failed")

    async def _recover(self, cell: Cell, output: str, budget: int) -> dict[str, dict[str, Any]]:
        """Nothing printed or returned is lost without a trace (seed 004 §5.9): when a preview will cut the
        output (its budget, the newest-kept buffer, the producer credit), the cell's capture gets its file
        now; a result past 32 KiB or an error past 4 KiB is written to its own file. Returns those two."""
        capture = cell.capture
        cut = (cell.output.last_dropped > 0 or cell.lost_chars > 0
               or len(output.encode("utf-8", "replace")) > output_budget(cell, budget))
        if capture is not None:
            if cut or (cell.state == "running" and not capture.in_memory):
                await capture.ensure_file()  # a stable path, even while the cell still runs
            if cell.state != "running":
                await capture.settle()  # the file is complete before its path is handed out
        saved: dict[str, dict[str, Any]] = {}
        store = getattr(self.services.extras.get(SHELL_FAMILY_KEY), "store", None)
        if store is None:
            return saved
        lim = cell.limits
        chosen = {"result": cell.result_json if cell.state == "completed" else None,
                  "error": cell.error if cell.state == "failed" else None}
        for kind, text in chosen.items():
            preview = lim.result_preview_bytes if kind == "result" else lim.error_preview_bytes
            if text is not None and len(text.encode("utf-8", "replace")) > preview:
                saved[kind] = await asyncio.to_thread(save_text, store, f"cell-{cell.id}-{kind}", text)
        return saved

    async def _await_cell(self, cell: Cell, yield_s: float) -> None:
        """Until the cell ends or `yield_s` passes; a question being asked for it holds the call open (it rides
        this call's channel), and once it is answered the yield time starts over."""
        while cell.state == "running" and yield_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cell.done.wait(), yield_s)
            if cell.state != "running" or not self._asking.get(cell.id):
                return
            while cell.state == "running" and (open_ := self._asking.get(cell.id)):
                waits = {asyncio.ensure_future(cell.done.wait()), *(asyncio.ensure_future(e.wait()) for e in open_)}
                try:
                    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for w in waits:
                        w.cancel()

    def tools(self) -> Iterable[Tool]:
        return [
            Tool(name="exec", description=EXEC_DESCRIPTION, family=self.name, capability="code_mode",
                 args_model=ExecArgs, execute=self.exec_, parameters=EXEC_SCHEMA, parallel=True,
                 custom_format={"type": "grammar", "syntax": "lark", "definition": GRAMMAR}),
            Tool(name="wait", description=WAIT_DESCRIPTION, family=self.name, capability="code_mode",
                 args_model=WaitArgs, execute=self.wait, parameters=WAIT_SCHEMA, parallel=True),
        ]

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await self.manager.close()
        await self.pool.close()


def create_family(services: Services) -> CodeModeFamily:
    return CodeModeFamily(services)
