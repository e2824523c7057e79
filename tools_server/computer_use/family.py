"""The Computer Use family (seed 004 §4.5, §5.5): six sequential tools over one backend.

One action at a time across the whole tool server (one lock), never retried. Every app-specific call
passes the approval gate first. An action that times out or is cancelled after dispatch has an unknown
outcome: that app then needs a successful get_app_state before anything else is done to it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config import ComputerUseConfig
from tools_server.computer_use import schemas
from tools_server.computer_use.approval import Approvals, approval_message, confirm_from
from tools_server.computer_use.errors import ComputerUseError
from tools_server.computer_use.images import sniff_mime
from tools_server.computer_use.model import ActionCall, AppInfo, AppState, Backend, Target
from tools_server.discovery.family import key_of
from tools_server.registry import CallContext, ImageContent, Services, Tool, ToolResult

LIST, STATE, CLICK, TYPE, KEY, SCROLL = (
    "computer_use_list_apps", "computer_use_get_app_state", "computer_use_click", "computer_use_type_text",
    "computer_use_press_key", "computer_use_scroll")
UNKNOWN_OUTCOME = ("outcome-unknown", "app-server-exited")  # the backend's own word that the effect is unknown
ACTION_TIMEOUT = 60.0  # one Linux action, generous: AT-SPI is slow on a loaded machine


@dataclass(frozen=True)
class Served:
    """One finished call, for tests and the bench: the order and extent of what ran."""

    seq: int
    tool: str
    started: float
    ended: float


def make_backend(config: ComputerUseConfig) -> Backend:
    kind = config.backend
    if kind == "auto":
        kind = "macos" if sys.platform == "darwin" else "linux"
    if kind == "macos":
        from tools_server.computer_use.macos.backend import MacBackend

        return MacBackend(config)
    from tools_server.computer_use.linux.backend import LinuxBackend

    return LinuxBackend(config)


class ComputerUseFamily:
    name = "computer_use"

    def __init__(self, services: Services, backend: Backend | None = None, action_timeout: float = ACTION_TIMEOUT):
        self.services = services
        self.config: ComputerUseConfig = services.config.computer_use
        self._backend = backend
        self.approvals = Approvals(self.config.approval_mode)
        self.action_timeout = action_timeout
        self._lock = asyncio.Lock()
        self._unknown: set[str] = set()  # apps (canonical names) whose last action's outcome is unknown
        self.served: list[Served] = []
        self._seq = 0
        self._published: Path | None = None  # the desktop file written for `ctproxy status`, once
        services.extras["computer_use.family"] = self

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = make_backend(self.config)
        return self._backend

    def tools(self) -> Iterable[Tool]:
        spec = [(LIST, schemas.ListAppsArgs, self.list_apps, True),
                (STATE, schemas.AppArgs, self.get_app_state, True),
                (CLICK, schemas.ClickArgs, self.click, False),
                (TYPE, schemas.TypeTextArgs, self.type_text, False),
                (KEY, schemas.PressKeyArgs, self.press_key, False),
                (SCROLL, schemas.ScrollArgs, self.scroll, False)]
        return [Tool(name=name, description=schemas.DESCRIPTIONS[name], family=self.name, capability="computer_use",
                     args_model=model, execute=fn, parallel=False, read_only=ro) for name, model, fn, ro in spec]

    async def close(self) -> None:
        self.approvals.clear()
        if self._backend is not None:
            await self._backend.close()
        if self._published is not None:
            self._published.unlink(missing_ok=True)
            self._published = None

    # -- the one path every call takes -----------------------------------------------------------------
    async def _serve(self, tool: str, ctx: CallContext, run: Callable[[], Awaitable[ToolResult]]) -> ToolResult:
        async with self._lock:
            self._seq += 1
            seq, started = self._seq, time.monotonic()
            try:
                if ctx.cancel.is_set():
                    raise ComputerUseError(tool, "cancelled", "the call was cancelled before anything was done")
                return await run()
            finally:
                self.served.append(Served(seq, tool, started, time.monotonic()))
                del self.served[:-200]
                self._publish_desktop()

    def _publish_desktop(self) -> None:
        """Once the private desktop runs, say where in the state directory, for `ctproxy status` (another
        process) to name it: its display and the tool server's pid (a file left by a dead server is ignored)."""
        desktop = self.private_desktop()
        if desktop is None or self._published:
            return
        from proxy.app.status import DESKTOP_FILE, write_desktop_file

        write_desktop_file(self.services.state, {"pid": os.getpid(), "display": desktop["DISPLAY"]})
        self._published = self.services.state.root / DESKTOP_FILE

    def _call(self, tool: str, app: str, ctx: CallContext) -> ActionCall:
        # approvals are the caller's own: a grant another caller gave does not cover this one
        return ActionCall(tool=tool, app=app, approvals=self.approvals.for_caller(key_of(ctx.session, ctx.task,
                                                                                         ctx.agent)),
                          confirm=confirm_from(ctx))

    async def _approved(self, call: ActionCall) -> AppInfo:
        app = await self.backend.resolve(call)
        if getattr(self.backend, "asks_approval_itself", False) or call.approvals.granted(app.name):
            return app
        if call.confirm is None:
            raise ComputerUseError(call.tool, "approval-unavailable",
                                   f"'{app.name}' is not approved yet and this client cannot be asked (approval "
                                   "needs an MCP client with elicitation, or computer_use.approval_mode "
                                   "'always'); nothing was done")
        try:
            answer = await call.confirm(approval_message(app.name))
        except Exception as exc:  # the client has no back channel after all
            raise ComputerUseError(call.tool, "approval-unavailable",
                                   f"could not ask for approval of '{app.name}' ({type(exc).__name__}); "
                                   "nothing was done") from exc
        if answer != "accept":
            raise ComputerUseError(call.tool, "approval-declined",
                                   f"the user did not approve '{app.name}'; nothing was done")
        call.approvals.grant(app.name)
        return app

    async def _dispatch(self, call: ActionCall, app: AppInfo, ctx: CallContext, action: Awaitable[Any]) -> Any:
        """Run a dispatched action: a timeout, a cancel or a lost connection leaves its outcome unknown."""
        task = asyncio.ensure_future(action)
        cancel = asyncio.ensure_future(ctx.cancel.wait())
        # a backend with its own (pausable) budget says so; else the family's bound applies
        timeout = getattr(self.backend, "action_timeout", self.action_timeout)
        try:
            done, _ = await asyncio.wait({task, cancel}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            self._unknown.add(app.name)
            raise
        finally:
            cancel.cancel()
        if task in done:
            try:
                return task.result()
            except ComputerUseError as exc:
                if exc.code in UNKNOWN_OUTCOME:
                    self._unknown.add(app.name)
                raise
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        self._unknown.add(app.name)
        why = "was cancelled" if ctx.cancel.is_set() else f"did not finish in {self.action_timeout:g} s"
        raise ComputerUseError(call.tool, "outcome-unknown",
                               f"the action on '{app.name}' {why}; whether it took effect is unknown. Call "
                               "computer_use_get_app_state before the next action (it is not retried)")

    def _require_known(self, call: ActionCall, app: AppInfo) -> None:
        if app.name in self._unknown:
            raise ComputerUseError(call.tool, "state-required",
                                   f"the last action on '{app.name}' has an unknown outcome; call "
                                   "computer_use_get_app_state first (nothing was done)")

    def private_desktop(self) -> dict[str, str] | None:
        """The private desktop's published environment (computer_use.start_xvfb), once it runs; else None.
        The shell family spawns with it, so a model can start an app where Computer Use looks."""
        desktop = getattr(self.backend, "desktop", None)
        desk = desktop() if callable(desktop) else desktop
        published = getattr(desk, "published", None)
        return published() if callable(published) else None

    # -- executors ------------------------------------------------------------------------------------
    async def list_apps(self, args: schemas.ListAppsArgs, ctx: CallContext) -> ToolResult:
        async def run() -> ToolResult:
            apps = await self.backend.list_apps(self._call(LIST, "", ctx))
            lines = [f"{a.name}{' [active]' if a.active else ''} ({a.ident or 'pid ' + str(a.pid)}) windows: "
                     + (", ".join(f'"{t}"' for t in a.windows) or "none") for a in apps]
            text = "\n".join(lines) if lines else "No app with a window is running."
            details: dict[str, Any] = {"apps": [
                {"name": a.name, "pid": a.pid, "ident": a.ident, "windows": list(a.windows), "active": a.active}
                for a in apps]}
            if (desk := self.private_desktop()) is not None:  # seed 004 defect 14: say where the tools point
                details["desktop"] = {"private": True, "display": desk["DISPLAY"]}
                text += f"\n(ctproxy's private desktop, DISPLAY={desk['DISPLAY']}{self._how_to_start_apps()})"
            return ToolResult(text=text, details=details)
        return await self._serve(LIST, ctx, run)

    def _how_to_start_apps(self) -> str:
        """seed004 N5: only what is true for this shell. The sandbox hides the desktop's X socket and buses."""
        shell = self.services.config.shell
        if not shell.enabled:
            return ""
        if shell.sandbox == "danger-full-access":
            return (": start an app on it with exec_command, which runs with this desktop's DISPLAY, XAUTHORITY and "
                    "session bus")
        return (f": exec_command cannot start an app on it, because shell.sandbox {shell.sandbox} hides the "
                "desktop's X socket and buses from commands (only danger-full-access reaches them)")

    async def get_app_state(self, args: schemas.AppArgs, ctx: CallContext) -> ToolResult:
        async def run() -> ToolResult:
            call = self._call(STATE, args.app, ctx)
            app = await self._approved(call)
            state: AppState = await self._dispatch(call, app, ctx, self.backend.get_app_state(call, app))
            self._unknown.discard(app.name)
            return _state_result(call, state)
        return await self._serve(STATE, ctx, run)

    async def _act(self, tool: str, app_name: str, ctx: CallContext,
                   act: Callable[[ActionCall, AppInfo], Awaitable[str]]) -> ToolResult:
        async def run() -> ToolResult:
            call = self._call(tool, app_name, ctx)
            app = await self._approved(call)
            self._require_known(call, app)
            text = await self._dispatch(call, app, ctx, act(call, app))
            return ToolResult(text=text, details={"app": app.name})
        return await self._serve(tool, ctx, run)

    async def click(self, args: schemas.ClickArgs, ctx: CallContext) -> ToolResult:
        target = Target(args.element_index, args.x, args.y)
        return await self._act(CLICK, args.app, ctx, lambda call, app: self.backend.click(
            call, app, target, args.button, args.click_count))

    async def type_text(self, args: schemas.TypeTextArgs, ctx: CallContext) -> ToolResult:
        return await self._act(TYPE, args.app, ctx, lambda call, app: self.backend.type_text(call, app, args.text))

    async def press_key(self, args: schemas.PressKeyArgs, ctx: CallContext) -> ToolResult:
        return await self._act(KEY, args.app, ctx, lambda call, app: self.backend.press_key(call, app, args.key))

    async def scroll(self, args: schemas.ScrollArgs, ctx: CallContext) -> ToolResult:
        target = Target(args.element_index, args.x, args.y)
        return await self._act(SCROLL, args.app, ctx, lambda call, app: self.backend.scroll(
            call, app, target, args.direction, args.amount))


def _state_result(call: ActionCall, state: AppState) -> ToolResult:
    images = []
    if state.screenshot is not None:
        mime = sniff_mime(state.screenshot.data)
        if mime is None or mime != state.screenshot.mime_type:
            raise ComputerUseError(call.tool, "bad-image",
                                   "the screenshot is neither PNG nor JPEG (or its type does not match its bytes)")
        images.append(ImageContent(base64.b64encode(state.screenshot.data).decode("ascii"), mime))
    return ToolResult(text=state.text, details=state.details, images=images)


def create_family(services: Services) -> ComputerUseFamily:
    return ComputerUseFamily(services)
