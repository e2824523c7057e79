"""Cells and the cell manager (seed 004 §5.7): admission, nested-call accounting, limits, observation.

A cell is one program in one isolate. Its driver drains the isolate's outbox (printed text, tool calls,
the program's end), runs each admitted tool call through the `dispatch` it was given (the registry's
own tools, see family.py), and delivers the replies. The rules that matter:

- a cell completes only when its program ended *and* every nested call it started has settled; a
  rejected tool promise that nothing observed fails the cell (never a silent success);
- a failed or terminated cell refuses new calls and cancels the calls still waiting for a slot; a
  dispatched call is told the cell ended (its context's `detach`): a shell call returns at once without
  reading, so a shell it started keeps running (or its exit waits unread) and `write_stdin` continues it,
  and an approval question still open is withdrawn. The observer gives the dispatched calls a moment to
  settle before it reports; one still running then is `unsettled`, never done; code is never run twice;
- every limit overflow is a short control error delivered to the call that overflowed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from tools_server.codemode.engine import Engine, EngineError, Reply
from tools_server.codemode.limits import CellLimits
from tools_server.registry import ToolError, ToolResult

log = logging.getLogger("ctproxy.tools")

CellState = Literal["running", "completed", "failed", "terminated"]
CallState = Literal["queued", "running", "completed", "failed", "cancelled"]
Owner = tuple[str, str]
SHELL_TOOLS = ("exec_command", "write_stdin")
ShellState = Literal["running", "exited", "closed"]
SETTLE_S = 5.0  # how long an observer of an ended cell lets its dispatched calls come back
GONE_REMEMBERED = 1024  # IDs of cells dropped or read, remembered so `wait` can say what became of them
SALVAGE_S = 5.0  # how long a stop waits to read what a stopped program printed last


@dataclass
class NestedCall:
    id: int
    name: str
    state: CallState = "queued"
    task: asyncio.Task | None = None


@dataclass(frozen=True)
class Effects:
    """What the cell's nested calls did, counted when the cell ended (unsettled: still running then)."""

    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    unsettled: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"completed": self.completed, "failed": self.failed, "cancelled": self.cancelled,
                "unsettled": self.unsettled}

    @property
    def total(self) -> int:
        return self.completed + self.failed + self.cancelled + self.unsettled


@dataclass
class OutputBuffer:
    """Printed text not yet read, newest kept: past `budget` bytes the oldest unread text is dropped (and
    counted), so an observation always shows what the cell printed last. Read once per observation; the
    whole text is in the cell's capture file (seed §5.9), whose path the answer names when anything was
    not shown."""

    budget: int
    chunks: deque[str] = field(default_factory=deque)
    kept_bytes: int = 0
    total_bytes: int = 0
    dropped: int = 0  # unread bytes dropped since the last read
    clipped: bool = False  # the last read (or, before any, the unread text) lost its oldest part
    last_dropped: int = 0  # what the last read_unread() had to leave out

    def append(self, text: str) -> None:
        size = len(text.encode("utf-8", "replace"))
        self.total_bytes += size
        self.chunks.append(text)
        self.kept_bytes += size
        while self.kept_bytes > self.budget and self.chunks:
            first = self.chunks[0].encode("utf-8", "replace")
            excess = self.kept_bytes - self.budget
            if len(first) <= excess:
                self.chunks.popleft()
                self.kept_bytes -= len(first)
                self.dropped += len(first)
            else:
                rest = first[excess:].decode("utf-8", "ignore")
                self.chunks[0] = rest
                cut = len(first) - len(rest.encode("utf-8"))
                self.kept_bytes -= cut
                self.dropped += cut
            self.clipped = True

    def read_unread(self) -> str:
        text = "".join(self.chunks)
        self.chunks.clear()
        self.kept_bytes = 0
        self.last_dropped, self.dropped = self.dropped, 0
        self.clipped = self.last_dropped > 0
        return text


Dispatch = Callable[[str, dict[str, Any], "Cell"], Awaitable[ToolResult]]


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "replace"))


class Cell:
    def __init__(self, cell_id: str, owner: Owner, source: str, adapters: frozenset[str], engine: Engine,
                 dispatch: Dispatch, limits: CellLimits, slots: asyncio.Semaphore,
                 on_terminal: Callable[[Cell], None], context: Any = None, capture: Any = None):
        self.id = cell_id
        self.owner = owner
        self.source = source
        self.adapters = adapters
        self.engine = engine
        self.dispatch = dispatch
        self.limits = limits
        self.slots = slots
        self.context = context  # the outer exec call's CallContext (identity for nested calls)
        self._on_terminal = on_terminal
        self.state: CellState = "running"
        self.started = time.monotonic()
        self.ended: float | None = None
        self.output = OutputBuffer(limits.output_preview_bytes)
        # the whole printed text, past the preview, in a private file (seed §5.9; the shell's capture store)
        self.capture = capture
        self.result_json: str | None = None
        self.error: str | None = None
        self.error_code: str | None = None
        self.calls: dict[int, NestedCall] = {}
        self.args_total = 0
        self.replies: list[Reply] = []
        self.reply_bytes = 0
        self.program_done = False
        self.closed = False  # refuses new calls
        self.effects: Effects | None = None
        # session id -> "running", "exited" (its exit and last output unread: write_stdin reads them) or
        # "closed" (read to the end), as the cell's nested calls last saw it
        self.shells: dict[str, ShellState] = {}
        self.lost_chars = 0  # printed past the producer credit (engine.OUTPUT_CREDIT)
        self._stopping = False
        self.expired = False  # stopped by the wall-clock limit (limits.max_wall_time_s)
        self._deadline: asyncio.TimerHandle | None = None
        self._expiry: asyncio.Future[bool] | None = None
        self.done = asyncio.Event()
        self.running_code = asyncio.Event()  # the engine has booted: the program starts now
        self.observe_lock = asyncio.Lock()
        self.read_terminal = False
        self.terminal_at: float | None = None
        self._wake = asyncio.Event()
        self._driver: asyncio.Task | None = None

    # -- life --------------------------------------------------------------------------------------
    def launch(self) -> None:
        loop = asyncio.get_running_loop()
        self._driver = loop.create_task(self._run())
        self._deadline = loop.call_later(self.limits.max_wall_time_s, self._expire)

    def _expire(self) -> None:
        """The wall-clock limit: a cell still running is stopped (what it printed is kept), and says why."""
        if self.state == "running":
            self.expired = True
            self._expiry = asyncio.ensure_future(self.stop())

    async def _run(self) -> None:
        try:
            await self.engine.boot(sorted(self.adapters))
            self.running_code.set()  # (start runs the program's synchronous part: it may never return)
            await self.engine.start(self.source)
            probed = False
            while self.state == "running":
                messages = await self.engine.drain()
                for message in messages:
                    self._handle(message)
                if self.engine.memory_exceeded():
                    raise EngineError("the cell exceeded its memory limit", "memory-limit")
                if self.state != "running":
                    break
                if messages:
                    probed = False
                if self.program_done and not self._open_calls() and not self.replies:
                    check = await self.engine.final_check()
                    if check.get("floating"):
                        self._fail("a nested tool call failed and nothing awaited or caught its rejection",
                                   "unhandled-rejection")
                    else:
                        self._finish("completed")
                    break
                if not self.replies:
                    if not probed and not self._open_calls():
                        probed = True  # one more look: reactions may still have been running
                        continue
                    self._wake.clear()
                    await self._wake.wait()
                batch, self.replies = self.replies, []
                released = sum(_utf8_len(r.value) for r in batch if r.ok)
                await self.engine.deliver(batch)
                self.reply_bytes -= released  # released at reply-received, as the seed says
                probed = False
        except EngineError as exc:
            self._fail(exc.message, exc.code)
        except asyncio.CancelledError:
            if self.state == "running" and self._stopping:
                await self._salvage()
            if self.state == "running":
                self._finish("terminated")
            raise
        except Exception as exc:  # a bug here must not look like success, nor leak a traceback
            log.warning("code mode cell driver failed: %s", type(exc).__name__)
            self._fail(f"the cell failed with an internal error ({type(exc).__name__})", "internal-error")
        finally:
            self.engine.close()

    async def _salvage(self) -> None:
        """A stop cancelled the isolate's running evaluation (a CPU loop, a long synchronous run): what it
        printed before is still in its outbox. One bounded read keeps it (seed defect 8)."""
        with contextlib.suppress(Exception, asyncio.CancelledError):
            for message in await asyncio.wait_for(self.engine.drain(), SALVAGE_S):
                if message.get("k") in ("out", "lost"):
                    self._handle(message)

    async def stop(self) -> bool:
        """Stop the program, keeping what it printed before: the driver's evaluation is cancelled (that
        ends even a CPU loop), its outbox read once, then the cell is terminated. False when it had
        already ended (its known result stays)."""
        if self.state != "running":
            return False
        driver = self._driver
        if driver is not None and not driver.done():
            self._stopping = True
            driver.cancel()
            await asyncio.wait({driver}, timeout=SALVAGE_S + 1)
        if self.state == "running":
            self.terminate()
        return True

    def terminate(self) -> bool:
        """Stop the program now. False when it had already ended (its known result stays)."""
        if self.state != "running":
            return False
        self._finish("terminated")
        self.engine.close()
        if self._driver is not None:
            self._driver.cancel()
        return True

    # -- messages from the isolate -----------------------------------------------------------------
    def _handle(self, message: dict[str, Any]) -> None:
        kind = message.get("k")
        if kind == "out":
            if isinstance(message.get("s"), str):
                self.output.append(message["s"])
                if self.capture is not None:
                    self.capture.feed(message["s"].encode("utf-8", "replace"))
        elif kind == "lost" and isinstance(message.get("n"), int):
            # past the producer credit: the isolate kept none of it; say so where the output is read
            note = (f"\n[… {message['n']} characters printed without a pause were not kept: a cell may print "
                    "512 KiB between two awaits …]\n")
            self.output.append(note)
            self.lost_chars += message["n"]
            if self.capture is not None:
                self.capture.feed(note.encode("utf-8"))
                self.capture.note_loss()
        elif kind == "call":
            self._on_call(message)
        elif kind == "done":
            self.program_done = True
            result = message.get("r")
            self.result_json = result if isinstance(result, str) else None
        elif kind == "fail":
            text = str(message.get("e") or "the script failed")
            if isinstance(message.get("line"), int):
                text += f" (line {message['line']})"
            code = message.get("code")
            self._fail(text, code if isinstance(code, str) and code else "script-error")

    def _control_error(self, call_id: int, code: str, message: str) -> None:
        # control errors are short and never count against the reply budget
        self.replies.append(Reply(call_id, False, message, code))
        self._wake.set()

    def _open_calls(self) -> int:
        return sum(1 for c in self.calls.values() if c.state in ("queued", "running"))

    def _on_call(self, message: dict[str, Any]) -> None:
        call_id, name, args_text = message.get("id"), message.get("name"), message.get("args")
        if not isinstance(call_id, int) or not isinstance(name, str) or not isinstance(args_text, str):
            return
        lim = self.limits
        size = _utf8_len(args_text)
        if self.closed:
            return self._control_error(call_id, "cell-closed", f"tools.{name}: the cell has ended; nothing was run")
        if name not in self.adapters:
            return self._control_error(call_id, "not-declared",
                                       f"tools.{name} is not declared in this cell's `uses`; nothing was run")
        if size > lim.max_payload_bytes:
            return self._control_error(call_id, "limit-exceeded",
                                       f"tools.{name}: the arguments are {size} bytes, more than the "
                                       f"{lim.max_payload_bytes} allowed for one argument; nothing was run")
        if self._open_calls() >= lim.max_outstanding_calls:
            return self._control_error(call_id, "limit-exceeded",
                                       f"tools.{name}: {lim.max_outstanding_calls} nested calls are already "
                                       "outstanding in this cell; await some first. Nothing was run")
        if self.args_total + size > lim.max_cumulative_args_bytes:
            return self._control_error(call_id, "limit-exceeded",
                                       f"tools.{name}: this cell's nested calls would send more than "
                                       f"{lim.max_cumulative_args_bytes} bytes of arguments in all; "
                                       "nothing was run")
        try:
            args = json.loads(args_text)
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return self._control_error(call_id, "invalid-arguments",
                                       f"tools.{name} takes one object of arguments; nothing was run")
        self.args_total += size
        call = NestedCall(call_id, name)
        self.calls[call_id] = call
        call.task = asyncio.get_running_loop().create_task(self._execute(call, args))

    async def _execute(self, call: NestedCall, args: dict[str, Any]) -> None:
        try:
            async with self.slots:
                if self.closed:
                    call.state = "cancelled"
                    return
                call.state = "running"
                try:
                    result = await self.dispatch(call.name, args, self)
                except ToolError as exc:
                    result = ToolResult.from_error(exc)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("code mode nested call failed unexpectedly: %s", type(exc).__name__)
                    result = ToolResult.from_error(ToolError(
                        f"{call.name} failed with an internal error ({type(exc).__name__}); its effect is unknown",
                        code="internal_error"))
        except asyncio.CancelledError:
            if call.state == "queued":
                call.state = "cancelled"
            raise
        call.state = "failed" if result.is_error else "completed"
        self._note_shell(call.name, args, result)
        if self.state != "running":
            # the cell has ended: the reply cannot be delivered. A shell call that read output or an exit
            # code on its way back hands it to whoever observes the cell, in its output: nothing is lost
            if call.name in SHELL_TOOLS and not result.details.get("detached"):
                self.output.append(f"\n[tools.{call.name} came back after the cell ended:]\n{result.text}\n")
            return
        self._queue_reply(call, result)

    def _note_shell(self, name: str, args: dict[str, Any], result: ToolResult) -> None:
        if name not in SHELL_TOOLS:
            return
        sid = result.details.get("session_id")
        if sid is None and name == "write_stdin":  # a poll that read the exit no longer names the session
            sid = args.get("session_id")
        if sid is None or (result.is_error and str(sid) not in self.shells):
            return
        d = result.details
        if result.is_error:  # e.g. stale-session: nothing more can be read from it
            self.shells[str(sid)] = "closed"
        elif d.get("detached"):
            self.shells[str(sid)] = "running" if d.get("running") else "exited"
        elif "exit_code" in d or d.get("terminated"):
            self.shells[str(sid)] = "closed"
        else:
            self.shells[str(sid)] = "running"

    def _queue_reply(self, call: NestedCall, result: ToolResult) -> None:
        lim = self.limits
        if result.is_error:
            message = result.text
            if _utf8_len(message) > lim.max_payload_bytes:
                message = message.encode("utf-8")[:lim.error_preview_bytes].decode("utf-8", "ignore") + " …(clipped)"
            code = str(result.details.get("error", "tool_failed"))
            self.replies.append(Reply(call.id, False, message, code))
            self._wake.set()
            return
        value = json.dumps(result.structured(), ensure_ascii=False)
        size = _utf8_len(value)
        if size > lim.max_payload_bytes:
            return self._control_error(call.id, "limit-exceeded",
                                       f"tools.{call.name} ran, but its result is {size} bytes, more than the "
                                       f"{lim.max_payload_bytes} a cell may receive; it is not run again")
        if self.reply_bytes + size > lim.max_queued_reply_bytes:
            return self._control_error(call.id, "limit-exceeded",
                                       f"tools.{call.name} ran, but the cell's queue of unread replies is full "
                                       f"({lim.max_queued_reply_bytes} bytes); it is not run again")
        self.reply_bytes += size
        self.replies.append(Reply(call.id, True, value))
        self._wake.set()

    # -- endings -----------------------------------------------------------------------------------
    def _close_calls(self) -> None:
        self.closed = True
        for call in self.calls.values():
            if call.state == "queued" and call.task is not None:
                call.task.cancel()  # still waiting for a slot: never dispatched

    def _fail(self, message: str, code: str) -> None:
        if self.state != "running":
            return
        self.error = message
        self.error_code = code
        self._finish("failed")

    def _finish(self, state: CellState) -> None:
        if self.state != "running":
            return
        self.state = state
        if self._deadline is not None:
            self._deadline.cancel()
        self._close_calls()
        self.ended = time.monotonic()
        self.effects = self._count_effects()
        if self.capture is not None:
            # a cell stopped without reading its outbox (a cancelled exec, the server closing) lost its last text
            self.capture.close_source(error=state == "terminated" and not self._stopping)
        self.terminal_at = time.monotonic()
        self.done.set()
        self._on_terminal(self)

    def _count_effects(self) -> Effects:
        counts = {"completed": 0, "failed": 0, "cancelled": 0, "unsettled": 0}
        for call in self.calls.values():
            key = {"queued": "cancelled", "running": "unsettled"}.get(call.state, call.state)
            counts[key] += 1
        return Effects(**counts)

    async def settle(self, timeout: float = SETTLE_S) -> None:
        """After the end: let the dispatched calls come back (they were told, `detach`), then count again.
        A shell call returns at once with its session; one that is still running after `timeout` stays
        `unsettled`."""
        if self.state == "running":
            return
        pending = [c.task for c in self.calls.values() if c.state == "running" and c.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        self.effects = self._count_effects()

    def wall_time(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class CellManager:
    """The cells of every caller. The caps are per caller (task, agent): running cells, nested calls
    executing at once, and unread results, so one agent can neither block another's `exec` nor evict its
    unread result; a server-wide bound on running cells stays as the last guard. An evicted or expired
    ID is remembered (bounded) so `wait` says what became of it."""

    def __init__(self, limits: CellLimits, dispatch: Dispatch, engine_factory: Callable[[], Engine],
                 capture_factory: Callable[[str], Any] | None = None):
        self.limits = limits
        self.capture_factory = capture_factory
        self.dispatch = dispatch
        self.engine_factory = engine_factory
        self.cells: dict[str, Cell] = {}
        self._slots: dict[Owner, asyncio.Semaphore] = {}
        self.gone: OrderedDict[str, tuple[Owner, str]] = OrderedDict()  # cell id -> (owner, why it is gone)
        self.closed = False

    def slots(self, owner: Owner) -> asyncio.Semaphore:
        if owner not in self._slots:
            self._slots[owner] = asyncio.Semaphore(self.limits.adapter_slots)
        return self._slots[owner]

    def running(self, owner: Owner | None = None) -> int:
        return sum(1 for c in self.cells.values() if c.state == "running" and (owner is None or c.owner == owner))

    def _forget(self, cell: Cell, why: str) -> None:
        self.cells.pop(cell.id, None)
        self.gone[cell.id] = (cell.owner, why)
        while len(self.gone) > GONE_REMEMBERED:
            self.gone.popitem(last=False)

    def _prune(self) -> None:
        now = time.monotonic()
        ttl = self.limits.terminal_ttl_s
        for cell in list(self.cells.values()):
            if cell.state != "running" and cell.terminal_at is not None and now - cell.terminal_at > ttl:
                self._forget(cell, f"its result was not read within {ttl:.0f} seconds of its end and was dropped")
        live = {c.owner for c in self.cells.values()}
        for owner in [o for o in self._slots if o not in live]:
            if not self._slots[owner].locked():
                del self._slots[owner]

    def _on_terminal(self, cell: Cell) -> None:
        unread = [c for c in self.cells.values() if c.state != "running" and c.owner == cell.owner and c is not cell]
        unread.append(cell)
        limit = self.limits.max_unread_terminal
        while len(unread) > limit:
            oldest = min(unread, key=lambda c: c.terminal_at or 0.0)
            unread.remove(oldest)
            self._forget(oldest, f"its result was dropped unread: this caller had more than {limit} finished "
                                 "cells it had not read, and it was the oldest")

    def start(self, owner: Owner, source: str, adapters: frozenset[str], context: Any = None) -> Cell:
        self._prune()
        if self.closed:
            raise ToolError("exec: code mode is shutting down; nothing was run", code="closed")
        if self.running(owner) >= self.limits.max_running_cells:
            raise ToolError(f"exec: you already have {self.limits.max_running_cells} cells running; finish one "
                            "with `wait` (or stop it with wait terminate) first. Nothing was run",
                            code="too-many-cells")
        if self.running() >= self.limits.max_running_cells_total:
            raise ToolError(f"exec: the server runs {self.limits.max_running_cells_total} cells already (all "
                            "callers); try again when one has ended. Nothing was run", code="too-many-cells")
        cell_id = secrets.token_hex(4)
        while cell_id in self.cells or cell_id in self.gone:
            cell_id = secrets.token_hex(4)
        try:
            engine = self.engine_factory()
        except Exception as exc:
            log.warning("code mode could not create an isolate: %s", type(exc).__name__)
            raise ToolError(f"exec: the JavaScript engine could not start ({type(exc).__name__}); nothing was run",
                            code="engine-unavailable") from None
        capture = self.capture_factory(cell_id) if self.capture_factory is not None else None
        cell = Cell(cell_id, owner, source, adapters, engine, self.dispatch, self.limits, self.slots(owner),
                    self._on_terminal, context, capture)
        self.cells[cell_id] = cell
        cell.launch()
        return cell

    def lookup(self, owner: Owner, cell_id: str) -> Cell | None:
        self._prune()
        cell = self.cells.get(cell_id)
        if cell is None or cell.owner != owner:
            return None
        return cell

    def why_gone(self, owner: Owner, cell_id: str) -> str | None:
        """What became of a cell of this caller that is no longer known, if it is remembered."""
        entry = self.gone.get(cell_id)
        return entry[1] if entry is not None and entry[0] == owner else None

    def mark_read(self, cell: Cell) -> None:
        """A terminal result is delivered once; after that the ID is unknown."""
        if cell.state != "running":
            self._forget(cell, "its result was already returned (a finished cell's result is returned once)")

    async def close(self) -> None:
        self.closed = True
        for cell in list(self.cells.values()):
            cell.terminate()
        for cell in list(self.cells.values()):
            if cell._driver is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await cell._driver
        self.cells.clear()
