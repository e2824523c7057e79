"""Computer Use through ChatGPT.app's bundled Codex app-server (seed 004 §4.5, §5.5).

Lazily: start `codex app-server` in a private temporary directory (also its CODEX_HOME and the thread's
cwd) → `initialize` → `initialized` → an ephemeral `thread/start` with only the `node_repl` MCP server
and only its `js` tool → wait until node_repl is connected. Then one `mcpServer/tool/call` per action,
running the fixed template. Sky asks for approval with a form elicitation; the answer follows
`computer_use.approval_mode` (see `_elicitation`). When the app-server exits, pending calls fail and
the next call starts a new one.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from proxy import __version__
from proxy.config import ComputerUseConfig
from tools_server.computer_use.approval import approval_message
from tools_server.computer_use.errors import ComputerUseError
from tools_server.computer_use.images import sniff_mime
from tools_server.computer_use.macos.paths import Runtime, bundled_runtime, unavailable_reason
from tools_server.computer_use.macos.rpc import AppServerExited, Budget, JsonlRpc, RpcError
from tools_server.computer_use.macos.templates import source_for
from tools_server.computer_use.model import ActionCall, AppInfo, AppState, Button, Direction, Screenshot, Target


class Budgets:
    """Seed 004 §4.5: outer 130 s per call (Sky's inner one is 120 s), MCP active time 300 s; startup and
    each handshake RPC are bounded too."""

    def __init__(self, outer: float = 130.0, rpc: float = 20.0, startup: float = 60.0, mcp_active: int = 300):
        self.outer, self.rpc, self.startup, self.mcp_active = outer, rpc, startup, mcp_active


ACCEPT_FOR_SESSION = {"action": "accept", "content": {}, "_meta": {"persist": "session"}}
DECLINE = {"action": "decline", "content": None}


class _Session:
    """One app-server process with its ephemeral thread. The approval Set belongs to the client that
    owns this session (the family), and a session serves one call at a time (the family's lock)."""

    def __init__(self, runtime: Runtime, budgets: Budgets, backend: MacBackend):
        self.runtime = runtime
        self.budgets = budgets
        self.backend = backend
        self.rpc = JsonlRpc(self._server_request)
        self.dir = Path(tempfile.mkdtemp(prefix="ctproxy-cu-"))
        self.thread: str | None = None
        self.call: ActionCall | None = None
        self.budget: Budget | None = None
        self.refusal: ComputerUseError | None = None  # what an elicitation answer said about the current call

    @property
    def alive(self) -> bool:
        return self.rpc.alive and self.thread is not None

    async def start(self, tool: str) -> None:
        env = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": os.environ.get("HOME", str(self.dir)),
               "CODEX_HOME": str(self.dir), "TMPDIR": str(self.dir)}
        try:
            await self.rpc.start([str(self.runtime.codex), "app-server"], cwd=str(self.dir), env=env)
            await self.rpc.request("initialize", {
                "clientInfo": {"name": "ctproxy", "title": "ctproxy Computer Use", "version": __version__},
                "capabilities": {"experimentalApi": False}}, self.budgets.rpc)
            await self.rpc.notify("initialized")
            started = await self.rpc.request("thread/start", {
                "cwd": str(self.dir), "ephemeral": True, "approvalPolicy": "never", "sandbox": "read-only",
                "config": {"mcp_servers": {"node_repl": {
                    "command": str(self.runtime.node_repl), "args": [], "enabled_tools": ["js"],
                    "tool_timeout_sec": self.budgets.mcp_active}}}}, self.budgets.rpc)
            self.thread = str(started["thread"]["id"])
            await self._ready()
        except (AppServerExited, RpcError, TimeoutError, KeyError, TypeError, OSError) as exc:
            await self.close()
            raise ComputerUseError(tool, "node-repl-unavailable",
                                   f"the Computer Use runtime did not become ready ({type(exc).__name__}); "
                                   "nothing was done") from exc

    async def _ready(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.budgets.startup
        while True:
            listing = await self.rpc.request("mcpServerStatus/list",
                                             {"threadId": self.thread, "detail": "toolsAndAuthOnly"}, self.budgets.rpc)
            for entry in listing.get("data", []):
                tools = entry.get("tools") or {}
                names = set(tools) if isinstance(tools, dict) else {t.get("name") for t in tools if isinstance(t, dict)}
                if entry.get("name") == "node_repl" and entry.get("runtimeStatus") == "connected" and "js" in names:
                    return
                if entry.get("name") == "node_repl" and entry.get("runtimeStatus") in ("failed", "disabled",
                                                                                         "cancelled"):
                    raise TimeoutError
            if loop.time() >= deadline:
                raise TimeoutError
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        self.thread = None
        await self.rpc.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    async def tool_call(self, call: ActionCall, op: str, params: dict[str, Any]) -> dict[str, Any]:
        self.call, self.budget, self.refusal = call, Budget(self.budgets.outer), None
        try:
            result = await self.rpc.request("mcpServer/tool/call", {
                "threadId": self.thread, "server": "node_repl", "tool": "js",
                "arguments": {"code": source_for(op, params)}}, self.budget)
        finally:
            self.call, self.budget = None, None
        if not isinstance(result, dict):
            raise ComputerUseError(call.tool, "action-failed", "the Computer Use runtime gave no result")
        return result

    # -- requests from the app-server ------------------------------------------------------------------
    async def _server_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "mcpServer/elicitation/request":
            return await self._elicitation(params)
        raise RpcError(-32601, f"method not supported: {method[:80]}")

    async def _elicitation(self, params: dict[str, Any]) -> dict[str, Any]:
        """Only the narrow Computer Use approval is answered; anything else is declined."""
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        tool_params = meta.get("tool_params") if isinstance(meta.get("tool_params"), dict) else {}
        app = tool_params.get("app").strip() if isinstance(tool_params.get("app"), str) else ""
        call, budget = self.call, self.budget
        if (call is None or budget is None or self.thread is None or params.get("threadId") != self.thread
                or params.get("serverName") != "node_repl" or params.get("mode") != "form"
                or meta.get("connector_id") != "computer-use" or not app):
            return DECLINE
        approvals = call.approvals
        if approvals.mode == "always":
            return ACCEPT_FOR_SESSION
        if approvals.has_grant(app):
            # node_repl's own persisted-state answer for an app this client already accepted
            return {**ACCEPT_FOR_SESSION, "_meta": {"persist": "session", "computer-use-persisted-state": True}}
        if call.confirm is None:
            self.refusal = ComputerUseError(call.tool, "approval-unavailable",
                                            f"'{app}' is not approved yet and this client cannot be asked (approval "
                                            "needs an MCP client with elicitation, or computer_use.approval_mode "
                                            "'always')")
            return DECLINE
        budget.pause()  # only this live confirmation wait stops the outer timer
        try:
            answer = await call.confirm(approval_message(app))
        except Exception:
            answer = "decline"
            self.refusal = ComputerUseError(call.tool, "approval-unavailable", f"could not ask for approval of '{app}'")
        finally:
            budget.resume()
        if self.call is not call:
            return DECLINE  # a late answer for a call that is over grants nothing
        if answer == "accept":
            approvals.grant(app)
            return ACCEPT_FOR_SESSION
        self.refusal = self.refusal or ComputerUseError(call.tool, "approval-declined",
                                                        f"the user did not approve '{app}'")
        return DECLINE


class MacBackend:
    name = "macos"
    asks_approval_itself = True  # Sky elicits per app; _Session._elicitation answers by the approval mode
    action_timeout = None  # the outer budget lives in each call (it pauses for confirmation)

    def __init__(self, config: ComputerUseConfig, runtime: Runtime | None = None, budgets: Budgets | None = None):
        self.config = config
        self.runtime = runtime
        self.budgets = budgets or Budgets()
        self._session: _Session | None = None
        self.starts = 0  # app-server processes started (tests: a crash is followed by a restart)

    async def _live(self, tool: str) -> _Session:
        if self._session is not None and self._session.alive:
            return self._session
        if self._session is not None:
            await self._session.close()
            self._session = None
        if (why := unavailable_reason(self.runtime)) is not None:
            raise ComputerUseError(tool, "backend-unavailable", why)
        session = _Session(self.runtime or bundled_runtime(), self.budgets, self)
        self.starts += 1
        await session.start(tool)
        self._session = session
        return session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _op(self, call: ActionCall, op: str, params: dict[str, Any]) -> dict[str, Any]:
        session = await self._live(call.tool)
        try:
            result = await session.tool_call(call, op, params)
        except AppServerExited as exc:
            await self.close()
            raise ComputerUseError(call.tool, "app-server-exited",
                                   "the Computer Use app-server exited during the call; whether the action took "
                                   "effect is unknown. The next call starts it again; call "
                                   "computer_use_get_app_state first") from exc
        except TimeoutError as exc:
            raise ComputerUseError(call.tool, "outcome-unknown",
                                   f"no answer within {self.budgets.outer:g} s; whether the action took effect is "
                                   "unknown. Call computer_use_get_app_state before the next action") from exc
        except RpcError as exc:
            raise ComputerUseError(call.tool, "action-failed", f"the app-server refused the call ({exc.code})") from exc
        if session.refusal is not None:
            raise session.refusal
        if result.get("isError"):
            texts = [c.get("text", "") for c in result.get("content") or [] if isinstance(c, dict)]
            raise ComputerUseError(call.tool, "action-failed", (" ".join(texts).strip() or "failed")[:2000])
        return result

    @staticmethod
    def _text(result: dict[str, Any]) -> str:
        return "\n".join(c.get("text", "") for c in result.get("content") or []
                         if isinstance(c, dict) and c.get("type") == "text")

    async def resolve(self, call: ActionCall) -> AppInfo:
        # Sky names the canonical app (in its elicitation); no hidden state read to find it here
        return AppInfo(name=call.app.strip(), ident=call.app.strip())

    async def list_apps(self, call: ActionCall) -> list[AppInfo]:
        result = await self._op(call, "list_apps", {})
        apps = (result.get("structuredContent") or {}).get("apps") or []
        return [AppInfo(name=str(a.get("name", "")), pid=a.get("pid"), windows=tuple(a.get("windows") or ()),
                        active=bool(a.get("active")), ident=str(a.get("bundleId") or a.get("name", "")))
                for a in apps if isinstance(a, dict)]

    async def get_app_state(self, call: ActionCall, app: AppInfo) -> AppState:
        result = await self._op(call, "get_app_state", {"app": app.name})
        shot = None
        for c in result.get("content") or []:
            if isinstance(c, dict) and c.get("type") == "image":
                try:
                    data = base64.b64decode(str(c.get("data", "")), validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise ComputerUseError(call.tool, "bad-image", "the screenshot is not base64") from exc
                mime = sniff_mime(data)
                if mime is None or mime != c.get("mimeType"):
                    raise ComputerUseError(call.tool, "bad-image",
                                           "the screenshot is neither PNG nor JPEG, or its MIME type does not match")
                shot = Screenshot(data, mime)
        return AppState(app=app.name, text=self._text(result), screenshot=shot, details={"app": app.name})

    @staticmethod
    def _target(target: Target) -> dict[str, Any]:
        if target.element_index is not None:
            return {"element_index": target.element_index}
        if target.x is not None and target.y is not None:
            return {"x": target.x, "y": target.y}
        return {}

    async def click(self, call: ActionCall, app: AppInfo, target: Target, button: Button, count: int) -> str:
        return self._text(await self._op(call, "click", {"app": app.name, **self._target(target), "button": button,
                                                         "click_count": count})) or "Clicked."

    async def type_text(self, call: ActionCall, app: AppInfo, text: str) -> str:
        return self._text(await self._op(call, "type_text", {"app": app.name, "text": text})) or "Typed."

    async def press_key(self, call: ActionCall, app: AppInfo, key: str) -> str:
        return self._text(await self._op(call, "press_key", {"app": app.name, "key": key})) or "Pressed."

    async def scroll(self, call: ActionCall, app: AppInfo, target: Target, direction: Direction, amount: int) -> str:
        return self._text(await self._op(call, "scroll", {"app": app.name, **self._target(target),
                                                          "direction": direction, "amount": amount})) or "Scrolled."


