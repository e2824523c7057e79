"""JSONL JSON-RPC with a child process, as the Codex app-server speaks it: one JSON object per line,
no `jsonrpc` field; requests `{id, method, params}`, answers `{id, result|error}`, notifications
`{method, params}`. The server may send requests too; `on_request` answers them. When the process
exits, every pending request fails with AppServerExited.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from proxy.errors import CtproxyError

log = logging.getLogger("ctproxy.tools")
MAX_LINE = 64 * 1024 * 1024  # a screenshot travels as base64 in one line


class AppServerExited(CtproxyError):
    def __init__(self, returncode: int | None):
        super().__init__(f"the app-server exited (code {returncode})")
        self.returncode = returncode


class RpcError(CtproxyError):
    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Budget:
    """A timer that can be paused: only a live confirmation wait pauses an invocation's outer budget."""

    def __init__(self, seconds: float):
        self._left = seconds
        self._since = time.monotonic()
        self._paused = 0
        self._changed = asyncio.Event()

    def pause(self) -> None:
        if self._paused == 0:
            self._left -= time.monotonic() - self._since
        self._paused += 1
        self._changed.set()

    def resume(self) -> None:
        self._paused -= 1
        if self._paused == 0:
            self._since = time.monotonic()
        self._changed.set()

    def remaining(self) -> float:
        return math.inf if self._paused else self._left - (time.monotonic() - self._since)

    async def wait(self, fut: asyncio.Future) -> Any:
        """The future's result, or TimeoutError once the (unpaused) budget is spent."""
        while True:
            self._changed.clear()
            left = self.remaining()
            if left <= 0:
                raise TimeoutError
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                done, _ = await asyncio.wait({fut, changed}, timeout=None if math.isinf(left) else left,
                                             return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
            if fut in done:
                return fut.result()
            if not done and self.remaining() <= 0:
                raise TimeoutError


RequestHandler = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


class JsonlRpc:
    def __init__(self, on_request: RequestHandler):
        self.on_request = on_request
        self.proc: asyncio.subprocess.Process | None = None
        self._next_id = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._reader: asyncio.Task | None = None
        self._handlers: set[asyncio.Task] = set()
        self.exited: asyncio.Event = asyncio.Event()

    @property
    def alive(self) -> bool:
        return self.proc is not None and not self.exited.is_set()

    async def start(self, argv: list[str], cwd: str, env: dict[str, str]) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, limit=MAX_LINE, start_new_session=True)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    log.debug("app-server sent a line that is not JSON (%d bytes)", len(line))
                    continue
                if isinstance(msg, dict):
                    self._dispatch(msg)
        except (ValueError, OSError) as exc:  # a line past MAX_LINE, a broken pipe
            log.debug("app-server output stopped: %s", type(exc).__name__)
        finally:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            code = await self.proc.wait()
            self.exited.set()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(AppServerExited(code))
            self._pending.clear()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "id" in msg and ("result" in msg or "error" in msg) and "method" not in msg:
            fut = self._pending.pop(msg["id"], None) if isinstance(msg["id"], int) else None
            if fut is None or fut.done():
                return  # an answer nobody waits for any more (its call timed out or was cancelled)
            if "error" in msg:
                err = msg["error"] if isinstance(msg["error"], dict) else {}
                fut.set_exception(RpcError(int(err.get("code", -32000)), str(err.get("message", ""))[:500]))
            else:
                fut.set_result(msg["result"])
        elif "method" in msg and "id" in msg:
            task = asyncio.create_task(self._answer(msg["id"], str(msg["method"]), msg.get("params") or {}))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        # notifications (turn/item events, status) are not needed: no model turn is ever started

    async def _answer(self, rid: Any, method: str, params: dict[str, Any]) -> None:
        try:
            result = await self.on_request(method, params if isinstance(params, dict) else {})
            reply: dict[str, Any] = {"id": rid, "result": result}
        except RpcError as exc:
            reply = {"id": rid, "error": {"code": exc.code, "message": exc.message}}
        except Exception as exc:
            log.warning("answering an app-server request failed: %s", type(exc).__name__)
            reply = {"id": rid, "error": {"code": -32603, "message": "internal error"}}
        with contextlib.suppress(AppServerExited, ConnectionError):
            await self._write(reply)

    async def _write(self, msg: dict[str, Any]) -> None:
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise AppServerExited(self.proc.returncode if self.proc else None)
        self.proc.stdin.write(json.dumps(msg, separators=(",", ":")).encode() + b"\n")
        await self.proc.stdin.drain()

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        msg: dict[str, Any] = {"method": method}
        if params is not None:
            msg["params"] = params
        await self._write(msg)

    async def request(self, method: str, params: dict[str, Any], budget: Budget | float) -> Any:
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            await self._write({"id": rid, "method": method, "params": params})
        except (AppServerExited, ConnectionError, BrokenPipeError) as exc:
            self._pending.pop(rid, None)
            raise AppServerExited(self.proc.returncode if self.proc else None) from exc
        try:
            return await (budget if isinstance(budget, Budget) else Budget(budget)).wait(fut)
        finally:
            self._pending.pop(rid, None)
            if not fut.done():
                fut.cancel()

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.exited.wait(), 5)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
        if self._reader is not None:
            with contextlib.suppress(BaseException):
                await self._reader
        for task in list(self._handlers):
            task.cancel()
