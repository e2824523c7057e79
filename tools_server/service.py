"""The one road every tool call takes: `ToolService.call(name, arguments, ctx)`.

REST (`POST /v1/tools/{name}`), MCP (`tools/call`), the proxy's bridge (`POST /v1/bridge/call`), Codex's
backend routes (`POST /v1/alpha/{history|notes}/v2/<tool>`) and code mode's nested calls (`tools.<name>()`
inside a cell) each turn their request into a `CallContext` and call this, in the shape of FastMCP's
`ToolManager.call_tool`. Here, once, in this order:

1. the caller: the context's task / agent / session (the transports resolved them from their headers);
   its discovery key is its session, else its task and agent (tools_server.discovery.family.key_of);
2. the tool: unknown or disabled is `unknown_tool` (raised: the transports answer it as a bad request);
3. discovery: with tool discovery on, a deferred tool the caller has not loaded is `not_loaded`, the same
   rule that hides it from this caller's `tools/list`, `GET /v1/tools` and bridged specs (`visible_tools`);
4. the arguments, validated against the tool's schema before any effect (raised, like 2);
5. availability: a file or shell tool with no workspace refuses here (`no_workspace`);
6. the policy seam (`tools_server.shell.seam`, configured by `shell.policy`): `context(call)` then
   `policy(call)`, for every tool, once, with the caller's identity, the road it came by and, for a
   nested call, its cell; the env overlay `context()` returned rides on the context to the shell spawn;
   then the context's own `gate`, if its road set one (a person approving a cell's nested patch: nobody
   is asked for what the policy refuses);
7. the tool's executor; a ToolError or an unexpected exception becomes the call's error result;
8. the journal (`journal.observe_call`: the dashboard's recent calls and the Prometheus counters): one
   record per call, with the tool's name, the road, the outcome (`ok`, `error`, `refused`, `cancelled`),
   the time and the agent — never the arguments or the result;
9. cancellation: a call whose caller went away (its task is cancelled) sets the context's `cancel` event
   the tools watch, is journaled `cancelled`, and the cancellation goes on up.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from tools_server.registry import (
    CallContext,
    ConfirmAnswer,
    Registry,
    Services,
    Tool,
    ToolError,
    ToolResult,
    Transport,
    UpstreamAccess,
    clip,
)
from tools_server.shell.errors import ShellError
from tools_server.shell.seam import InvocationCall, InvocationSeam, load_hooks
from tools_server.workspace import NO_WORKSPACE, no_workspace_message

log = logging.getLogger("ctproxy.tools")

SERVICE_KEY = "tool.service"  # services.extras: the road, for code mode's nested calls
DISCOVERY_KEY = "discovery.family"  # services.extras: tools_server.discovery.family.FAMILY_KEY
WORKSPACE_CAPABILITIES = frozenset({"apply_patch", "shell"})


class CallJournal(Protocol):
    def observe_call(self, name: str, transport: str, seconds: float, outcome: str, error: str | None = None,
                     agent: str | None = None) -> Any: ...


def availability(tool: Tool, services: Services) -> tuple[bool, str]:
    """Whether the tool can run here now, and why not."""
    if not services.config.enabled(tool.capability):
        return False, f"{tool.capability}.enabled is false"
    if tool.capability in WORKSPACE_CAPABILITIES and services.workspace is None:
        return False, "no workspace (start ctproxy with --workspace DIR)"
    return True, ""


class ToolService:
    def __init__(self, services: Services, registry: Registry, journal: CallJournal | None = None):
        self.services = services
        self.registry = registry
        self.journal = journal
        self._seam: tuple[str | None, InvocationSeam | None] | None = None
        services.extras[SERVICE_KEY] = self

    # -- the caller ---------------------------------------------------------------------------------
    def context(self, *, transport: Transport, task: str | None = None, agent: str | None = None,
                session: str | None = None, cwd: str | None = None, call_id: str | None = None,
                confirm: Callable[[str], Awaitable[ConfirmAnswer]] | None = None,
                upstream: UpstreamAccess | None = None) -> CallContext:
        """A call context from what a transport's request said. `cwd` is the x-ctp-cwd header as given: the
        file and shell tools resolve it inside the workspace and refuse it when it leaves it."""
        return CallContext(services=self.services, task=task or None, agent=agent or None,
                           session=session or None, call_id=call_id or None,
                           cwd=Path(cwd) if cwd else None, transport=transport, confirm=confirm,
                           upstream=upstream)

    # -- discovery ----------------------------------------------------------------------------------
    def _discovery(self) -> Any | None:
        family = self.services.extras.get(DISCOVERY_KEY)
        return family if family is not None and family.on else None

    def held_back(self, ctx: CallContext) -> frozenset[str]:
        """The deferred tools this caller has not loaded (nothing when discovery is off)."""
        family = self._discovery()
        return frozenset() if family is None else family.held_back(ctx)

    def visible_tools(self, ctx: CallContext) -> list[Tool]:
        """The enabled tools this caller may see and call now: what MCP `tools/list` and `GET /v1/tools`
        answer. `find_tools` is listed only while discovery is on (it is off otherwise)."""
        hold = self.held_back(ctx)
        return [t for t in self.registry.enabled_tools() if t.name not in hold]

    def resolve(self, name: str, ctx: CallContext) -> Tool:
        tool = self.registry.get(name)
        if tool is None and (why := self.registry.unavailable_reason(name)) is not None:
            raise ToolError(f"'{name}' is unavailable here: {why}", code="unavailable")
        if tool is None:
            known = ", ".join(sorted(t.name for t in self.visible_tools(ctx))) or "none"
            raise ToolError(f"unknown or disabled tool '{clip(name, 80)}'; enabled tools: {known}",
                            code="unknown_tool")
        if tool.name in self.held_back(ctx):
            raise ToolError(f"{tool.name} is deferred by tool discovery and not loaded for this session; call "
                            f"find_tools with {{\"load\": [\"{tool.name}\"]}} first, then call it",
                            code="not_loaded")
        return tool

    # -- the policy seam ----------------------------------------------------------------------------
    def seam(self, tool: str) -> InvocationSeam:
        path = self.services.config.shell.policy
        if self._seam is None or self._seam[0] != path:
            try:
                self._seam = (path, InvocationSeam(load_hooks(path)))
            except ValueError:
                self._seam = (path, None)
        seam = self._seam[1]
        if seam is None:  # a broken hook config refuses every call rather than running without policy
            raise ShellError(tool, "policy-refused",
                             "the configured invocation policy (shell.policy) cannot be loaded; nothing was run")
        return seam

    async def admit(self, tool: Tool, args: Any, ctx: CallContext) -> None:
        facts = await tool.policy_facts(args, ctx) if tool.policy_facts is not None else {}
        cwd = facts.get("cwd") or ctx.cwd or self.services.workspace
        call = InvocationCall(tool=tool.name, path="nested" if ctx.cell_id else "direct",
                              cwd=str(cwd) if cwd is not None else "", session_id=facts.get("session_id"),
                              cell_id=ctx.cell_id, task=ctx.task, agent=ctx.agent, transport=ctx.transport)
        ctx.env_overlay = await self.seam(tool.name).admit(call)

    # -- the call -----------------------------------------------------------------------------------
    async def call(self, name: str, arguments: Any, ctx: CallContext) -> ToolResult:
        """Run one call. Raises ToolError for a call that never reached the tool (unknown, not loaded, wrong
        arguments: the transports answer these as bad requests); every other failure is the result."""
        started = time.perf_counter()
        outcome, error = "exception", None
        try:
            tool = self.resolve(name, ctx)
            try:
                args = tool.validate(arguments)
            except ToolError:
                raise  # wrong arguments: the transports answer these as invalid requests
            except Exception as exc:  # a validator's own bug: the call's error, never a 500
                result = ToolResult.from_error(tool.unexpected(exc, ctx))
                outcome, error = "error", result.text
                return result
            result = await self._run(tool, args, ctx)
            outcome, error = ("error", result.text) if result.is_error else ("ok", None)
            return result
        except ToolError as exc:
            outcome, error = "refused", exc.message
            raise
        except asyncio.CancelledError:
            ctx.cancel.set()  # what the tools watch: a shell command it started is stopped
            outcome = "cancelled"
            raise
        finally:
            elapsed = time.perf_counter() - started
            # Only the tool name, road, outcome and timing: never arguments or results.
            log.debug("tool call name=%s transport=%s outcome=%s ms=%.1f", clip(name, 80), ctx.transport,
                      outcome, elapsed * 1000)
            if self.journal is not None:
                self.journal.observe_call(name, ctx.transport, elapsed, outcome, error, ctx.agent)

    async def _run(self, tool: Tool, args: Any, ctx: CallContext) -> ToolResult:
        try:
            if tool.capability in WORKSPACE_CAPABILITIES and self.services.workspace is None:
                raise ToolError(no_workspace_message(tool.name), code=NO_WORKSPACE)
            await self.admit(tool, args, ctx)
            if ctx.gate is not None:
                await ctx.gate(tool, args)
            if ctx.cancel.is_set():
                raise ToolError(f"{tool.name}: the call was cancelled before it started; nothing was run",
                                code="cancelled")
        except ToolError as exc:
            return ToolResult.from_error(exc)
        except Exception as exc:  # a hook that fails in a way the seam did not catch: refused, never a 500
            return ToolResult.from_error(tool.unexpected(exc, ctx))
        return await tool.run(args, ctx)
