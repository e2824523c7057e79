"""One call path for every transport (REST, MCP, bridge): find, validate, execute, log counts only."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tools_server.registry import CallContext, ConfirmAnswer, Registry, Services, ToolError, ToolResult, clip

log = logging.getLogger("ctproxy.tools")


class ToolService:
    def __init__(self, services: Services, registry: Registry):
        self.services = services
        self.registry = registry

    @staticmethod
    def resolve_cwd(cwd: str | None) -> Path | None:
        """The x-ctp-cwd header as given: the file and shell tools resolve it inside the workspace
        (tools_server.workspace), and refuse it when it leaves the workspace or there is none."""
        return Path(cwd) if cwd else None

    async def call(self, name: str, arguments: dict[str, Any], *, transport: str = "direct",
                   task: str | None = None, agent: str | None = None, cwd: str | None = None,
                   call_id: str | None = None,
                   confirm: Callable[[str], Awaitable[ConfirmAnswer]] | None = None) -> ToolResult:
        tool = self.registry.get(name)
        if tool is None and (why := self.registry.unavailable_reason(name)) is not None:
            raise ToolError(f"'{name}' is unavailable here: {why}", code="unavailable")
        if tool is None:
            known = ", ".join(sorted(t.name for t in self.registry.enabled_tools())) or "none"
            raise ToolError(f"unknown or disabled tool '{clip(name, 80)}'; enabled tools: {known}", code="unknown_tool")
        ctx = CallContext(services=self.services, task=task, agent=agent, call_id=call_id,
                          cwd=self.resolve_cwd(cwd), transport=transport,  # type: ignore[arg-type]
                          confirm=confirm)
        started = time.perf_counter()
        result = await tool.call(arguments, ctx)
        # Only the tool name, transport, outcome and timing: never arguments or results.
        log.debug("tool call name=%s transport=%s error=%s ms=%.1f", name, transport, result.is_error,
                  (time.perf_counter() - started) * 1000)
        return result
