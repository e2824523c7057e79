"""`find_tools` (seed 004 §5.8): search ctproxy's own tools and load deferred ones for this session.

Loads live in memory, per session (the CallContext's session, else its task and agent; over MCP the
MCP session). The one road (tools_server/service.py) enforces them on every transport: a deferred tool
the caller has not loaded is neither listed (MCP `tools/list`, `GET /v1/tools`, bridged specs) nor
callable (`not_loaded`). Loads survive config reloads and model changes, never reach a new session, and
are never persisted. Switching discovery off forgets them. Discovery runs no other tool and grants
nothing: a loaded tool is still checked by its own executor when called.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tools_server.discovery import rules
from tools_server.registry import CallContext, Registry, Services, Tool, ToolError, ToolResult
from tools_server.service import availability

REGISTRY_KEY = "registry"
FAMILY_KEY = "discovery.family"  # services.extras: this family, for the bridge (carried_tool_names)

DESCRIPTION = ("Finds ctproxy tools that are not loaded yet and loads them for this session. `query` searches "
               "tool names and descriptions (at most 8 hits, each with its status: active, eligible or "
               "unavailable); `load` takes exact names and makes the eligible ones callable from the next "
               "turn on.")

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "Words to look for in tool names and descriptions."},
        "load": {"type": "array", "items": {"type": "string"}, "description": "Exact tool names to load."},
    },
    "additionalProperties": False,
}


class FindToolsArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str | None = Field(None, max_length=500)
    load: list[str] | None = Field(None, max_length=64)

    @model_validator(mode="after")
    def _one_of(self) -> FindToolsArgs:
        if self.query is None and self.load is None:
            raise ValueError("give `query` (words to search for), `load` (exact tool names), or both")
        return self


def key_of(session: str | None, task: str | None, agent: str | None) -> str:
    """The loads' key of a caller: its session, else its task and agent (the bridge asks by these)."""
    return f"session:{session}" if session else f"agent:{task or ''}/{agent or ''}"


def session_key(ctx: CallContext) -> str:
    return key_of(ctx.session, ctx.task, ctx.agent)


class DiscoveryFamily:
    name = "discovery"

    def __init__(self, services: Services):
        self.services = services
        self._loads: dict[str, frozenset[str]] = {}
        services.extras[FAMILY_KEY] = self

    # -- state ----------------------------------------------------------------------------------------
    def _registry(self) -> Registry:
        registry = self.services.extras.get(REGISTRY_KEY)
        if registry is None:
            raise ToolError("find_tools has no tool registry", code="internal_error")
        return registry

    @property
    def on(self) -> bool:
        return self.services.config.enabled("tool_discovery")

    def deferred(self) -> frozenset[str]:
        return frozenset(self.services.config.tool_discovery.deferred)

    def loads(self, key: str) -> frozenset[str]:
        if not self.on:
            self._loads.clear()  # discovery off forgets every session's loads
            return frozenset()
        return self._loads.get(key, frozenset())

    def held_back(self, ctx: CallContext) -> frozenset[str]:
        """The deferred tools this caller has not loaded (the one road asks, tools_server/service.py)."""
        return self.deferred() - self.loads(session_key(ctx))

    def forget_session(self, key: str) -> None:
        self._loads.pop(key, None)

    def entries(self) -> dict[str, rules.ToolEntry]:
        """Each tool with why it cannot run now (None: it can), judged as `ctproxy status` judges its
        capability: off, no workspace, or Computer Use's own requirements (seed 004 defect 10)."""
        out: dict[str, rules.ToolEntry] = {}
        why_cap: dict[str, str | None] = {}
        for tool in self._registry().all_tools():
            if tool.name == rules.FIND_TOOLS:
                continue
            if tool.capability not in why_cap:
                why_cap[tool.capability] = self._unavailable(tool)
            out[tool.name] = rules.ToolEntry(tool.name, tool.description, why_cap[tool.capability])
        return out

    def _unavailable(self, tool: Tool) -> str | None:
        config = self.services.config
        if not config.enabled(tool.capability):
            return f"{tool.capability} is off (ctproxy config set {tool.capability}.enabled true)"
        ok, why = availability(tool, self.services)
        if not ok:
            return why
        if tool.capability == "computer_use":
            from proxy.app.status import computer_use_status

            state, reason = computer_use_status(config)
            if state == "unavailable":
                return reason
        return None

    def carried_tool_names(self, key: str) -> list[str]:
        """For the bridge: the enabled tools a bridged request of this session carries."""
        enabled = [t.name for t in self._registry().enabled_tools()]
        return rules.carried_tool_names(enabled, self.deferred(), self.loads(key), self.on)

    # -- the tool -------------------------------------------------------------------------------------
    async def find_tools(self, args: FindToolsArgs, ctx: CallContext) -> ToolResult:
        if not self.on:
            raise ToolError("find_tools: tool discovery is off (tool_discovery.enabled)", code="discovery-off")
        if (problem := rules.check_deferred(self.deferred())) is not None:
            raise ToolError(f"find_tools: {problem}", code="invalid-config")
        key = session_key(ctx)
        entries = self.entries()
        lines: list[str] = []
        details: dict[str, Any] = {}
        if args.load is not None:
            outcome = rules.load(args.load, entries, self.deferred(), self.loads(key))
            self._loads[key] = outcome.session_loads
            details.update(loaded=list(outcome.loaded), already_active=list(outcome.already),
                           rejected=[{"name": n, "reason": r} for n, r in outcome.rejected])
            if outcome.loaded:
                lines.append(f"Loaded for this session: {', '.join(outcome.loaded)} (callable from the next turn; "
                             "an MCP client sees it in its next tools/list)")
            if outcome.already:
                lines.append(f"Already active: {', '.join(outcome.already)}")
            for name, reason in outcome.rejected:
                lines.append(f"Rejected {name}: {reason}")
            if not args.load:
                lines.append("Nothing to load (the list is empty).")
        if args.query is not None:
            hits = rules.search(args.query, list(entries.values()), self.deferred(), self.loads(key))
            details["hits"] = [{"name": h.name, "summary": h.summary, "status": h.status} for h in hits]
            if hits:
                lines.append(f"{len(hits)} tool(s) match {args.query!r}:")
                lines.extend(f"- {h.name} [{h.status}]: {h.summary}" for h in hits)
            else:
                lines.append(f"No tool matches {args.query!r}.")
        return ToolResult(text="\n".join(lines), details=details)

    def tools(self) -> Iterable[Tool]:
        return [Tool(name=rules.FIND_TOOLS, description=DESCRIPTION, family=self.name, capability="tool_discovery",
                     args_model=FindToolsArgs, execute=self.find_tools, parameters=SCHEMA, parallel=False)]

    async def close(self) -> None:
        self._loads.clear()


def create_family(services: Services) -> DiscoveryFamily:
    return DiscoveryFamily(services)
