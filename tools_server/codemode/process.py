"""The engine code mode uses: each cell's isolate in its own worker process, under kernel limits.

`ProcessEngine` speaks the same `Engine` protocol as `V8Engine` (engine.py) — code strings in, strings out —
but the isolate lives in `worker.py`, a process with `RLIMIT_DATA` (every allocation, `ArrayBuffer` backing
stores included: see worker.py for why not `RLIMIT_AS`) and `RLIMIT_CPU`. The cell's driver (cells.py) is
unchanged: it drains the messages, runs each tool call through the tool server's one road
(`ToolService.call`, in this process) and delivers the replies, so a tool call made by a cell never runs
inside the worker: the worker holds only JavaScript.

A worker serves one cell and is killed with it (closing the engine kills the process, which ends any
JavaScript at once). Starting one costs about half a second (Python, mini-racer's library, V8), so the pool
keeps one booted spare: a cell takes it and a new spare starts in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any

from tools_server.codemode.engine import OUTPUT_CREDIT, EngineError, IsolateHost

log = logging.getLogger("ctproxy.tools")

WORKER = Path(__file__).with_name("worker.py")
SLACK_BYTES = 32 * 1024 * 1024  # the worker's own messages (a 1 MiB source, a 512 KiB outbox, JSON copies)
LINE_LIMIT = 64 * 1024 * 1024  # one JSON line from the worker (an outbox of 512 Ki UTF-16 units, escaped)
READY_TIMEOUT_S = 60.0
EXIT_MEMORY = 3  # worker.py
EXIT_SETUP = 4
# V8's words when the array-buffer allocator refuses (the kernel's RLIMIT_DATA said no)
ALLOCATION_FAILED = ("RangeError: Array buffer allocation failed",
                     "RangeError: WebAssembly.Memory(): could not allocate")
_reapers: set[asyncio.Task[Any]] = set()


def covers_array_buffers(platform: str | None = None) -> bool:
    """Whether a worker's memory limit covers ArrayBuffers here: RLIMIT_DATA bounds them on Linux only (macOS
    does not apply it to mmap), so elsewhere only V8's heap limit holds (status says so)."""
    return (platform or sys.platform).startswith("linux")


def memory_error(limit: int) -> EngineError:
    return EngineError(f"the cell exceeded its memory limit ({limit // (1024 * 1024)} MiB, ArrayBuffers "
                       "included)", "memory-limit")


class Worker:
    """One worker process, booted and limited, not yet used."""

    def __init__(self, proc: asyncio.subprocess.Process, ready: dict[str, Any]):
        self.proc = proc
        self.ready = ready
        self.stderr: deque[bytes] = deque(maxlen=64)
        self._stderr_task = asyncio.get_running_loop().create_task(self._read_stderr())

    @classmethod
    async def start(cls, memory_limit: int, cpu_seconds: float) -> Worker:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(WORKER), str(memory_limit), str(cpu_seconds), str(SLACK_BYTES),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT, start_new_session=True)
        try:
            assert proc.stdout is not None
            line = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S)
            ready = json.loads(line) if line else {}
            if not isinstance(ready, dict) or ready.get("ready") is not True:
                raise EngineError("the JavaScript worker could not start with its limits "
                                  f"({str(ready.get('error', 'no answer')) if isinstance(ready, dict) else '?'})",
                                  "engine-unavailable")
        except BaseException:
            _kill(proc)
            raise
        return cls(proc, ready)

    async def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        with contextlib.suppress(Exception):
            while line := await self.proc.stderr.readline():
                self.stderr.append(line[:500])

    def alive(self) -> bool:
        return self.proc.returncode is None

    def kill(self) -> None:
        _kill(self.proc)
        self._stderr_task.cancel()


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(RuntimeError):  # reap it (no zombie), without blocking the caller
        task = asyncio.get_running_loop().create_task(proc.wait())
        _reapers.add(task)
        task.add_done_callback(_reapers.discard)


class WorkerPool:
    """Boots workers for one family's limits; keeps one spare ready."""

    def __init__(self, memory_limit: int, cpu_seconds: float, spares: int = 1):
        self.memory_limit = memory_limit
        self.cpu_seconds = cpu_seconds
        self.spares = spares
        self._spare: asyncio.Task[Worker] | None = None
        self.closed = False

    def _boot(self) -> asyncio.Task[Worker]:
        return asyncio.get_running_loop().create_task(Worker.start(self.memory_limit, self.cpu_seconds))

    async def take(self) -> Worker:
        if self.closed:
            raise EngineError("code mode is shutting down", "closed")
        spare, self._spare = self._spare, None
        worker: Worker | None = None
        if spare is not None:
            try:
                worker = await asyncio.shield(spare)
            except asyncio.CancelledError:
                self._keep(spare)
                raise
            except Exception:
                worker = None
            if worker is not None and not worker.alive():
                worker = None
        if worker is None:
            worker = await Worker.start(self.memory_limit, self.cpu_seconds)
        if self.spares > 0 and self._spare is None and not self.closed:
            self._spare = self._boot()  # the next cell's, booting while this one runs
        return worker

    def _keep(self, spare: asyncio.Task[Worker]) -> None:
        """A taker gave up while the spare booted: it stays the spare (or is killed when one is there)."""
        if self._spare is None and not self.closed:
            self._spare = spare
            return

        def drop(task: asyncio.Task[Worker]) -> None:
            if not task.cancelled() and task.exception() is None:
                task.result().kill()
        spare.add_done_callback(drop)

    async def close(self) -> None:
        self.closed = True
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.cancel()
            with contextlib.suppress(BaseException):
                (await spare).kill()
        await reap()


async def reap(timeout: float = 10.0) -> None:
    """Waits for the killed workers of this loop to be reaped (no zombie, no transport left to a closed loop)."""
    loop = asyncio.get_running_loop()
    mine = [t for t in _reapers if t.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=timeout)


class ProcessEngine(IsolateHost):
    """One cell's isolate in a worker process taken from `pool` at boot."""

    def __init__(self, pool: WorkerPool, output_credit: int = OUTPUT_CREDIT):
        self._pool = pool
        self._credit = output_credit
        self._worker: Worker | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._seq = 0
        self._hard = False
        self._closed = False
        self._died: EngineError | None = None

    # -- the worker ---------------------------------------------------------------------------------
    async def _read(self, worker: Worker) -> None:
        assert worker.proc.stdout is not None
        try:
            while line := await worker.proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(msg, dict):
                    continue
                self._hard = self._hard or bool(msg.get("hard"))
                fut = self._pending.pop(msg.get("id"), None) if isinstance(msg.get("id"), int) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (Exception, asyncio.CancelledError):
            pass
        finally:
            if not self._closed:
                self._died = await self._why_dead(worker)
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(self._died or EngineError("the cell's isolate is closed", "closed"))
            self._pending.clear()

    async def _why_dead(self, worker: Worker) -> EngineError:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(worker.proc.wait(), 5)
        code = worker.proc.returncode
        text = b"".join(worker.stderr).decode("utf-8", "replace").lower()
        if code == -signal.SIGXCPU:
            return EngineError(f"the cell used up its CPU time limit ({self._pool.cpu_seconds:g} s) and was "
                               "stopped", "cpu-limit")
        if code == EXIT_MEMORY or "out of memory" in text:
            return memory_error(self._pool.memory_limit)
        if code == -signal.SIGKILL:
            return EngineError("the cell's JavaScript worker was killed (SIGKILL: past its CPU time limit, or by "
                               "the system's out-of-memory killer)", "engine-error")
        return EngineError(f"the cell's JavaScript worker ended unexpectedly (exit status {code})", "engine-error")

    async def _eval(self, code: str) -> Any:
        if self._closed or self._worker is None:
            raise EngineError("the cell's isolate is closed", "closed")
        if self._died is not None:
            raise self._died
        worker = self._worker
        self._seq += 1
        rid = self._seq
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        line = json.dumps({"id": rid, "op": "eval", "code": code}).encode("ascii") + b"\n"
        try:
            assert worker.proc.stdin is not None
            worker.proc.stdin.write(line)
            await worker.proc.stdin.drain()
            reply = await fut
        except asyncio.CancelledError:
            # a stop: the worker cancels the evaluation (that ends even a CPU loop); the isolate stays
            # readable for one more drain (cells.py salvages what the program printed)
            self._pending.pop(rid, None)
            with contextlib.suppress(Exception):
                assert worker.proc.stdin is not None
                worker.proc.stdin.write(json.dumps({"id": rid, "op": "cancel"}).encode("ascii") + b"\n")
            raise
        except (ConnectionError, OSError):
            self._pending.pop(rid, None)
            if self._reader is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.wait_for(asyncio.shield(self._reader), 6)
            raise self._died or EngineError("the cell's JavaScript worker is gone", "engine-error") from None
        if reply.get("ok"):
            return reply.get("v")
        kind = reply.get("kind")
        if kind == "memory" or self._hard:
            raise memory_error(self._pool.memory_limit)
        if kind == "cancelled":  # only after our own cancel, whose caller has gone: not expected here
            raise EngineError("the cell's evaluation was cancelled", "engine-error")
        raise EngineError(f"the JavaScript engine failed ({reply.get('error') or kind})", "engine-error")

    # -- the Engine protocol ------------------------------------------------------------------------
    async def boot(self, adapters: list[str]) -> None:
        worker = await self._pool.take()
        if self._closed:  # closed while the worker booted
            worker.kill()
            raise EngineError("the cell's isolate is closed", "closed")
        self._worker = worker
        self._reader = asyncio.get_running_loop().create_task(self._read(worker))
        await self._boot_isolate(adapters)

    async def drain(self) -> list[dict[str, Any]]:
        messages = await self._drain_messages()
        for m in messages:
            # the array-buffer allocator refused (the worker's RLIMIT_DATA): the cell's memory limit, not
            # a script error (a cell that catches the RangeError carries on below its limit)
            if m.get("k") == "fail" and isinstance(m.get("e"), str) and m["e"].startswith(ALLOCATION_FAILED):
                raise memory_error(self._pool.memory_limit)
        return messages

    def memory_exceeded(self) -> bool:
        return self._hard

    def close(self) -> None:
        """Kills the worker: whatever JavaScript runs ends at once, and its memory goes with it."""
        if self._closed:
            return
        self._closed = True
        if self._worker is not None:
            self._worker.kill()
        if self._reader is not None:
            self._reader.cancel()
