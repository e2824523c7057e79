"""The bridge endpoint: what the proxy needs to offer the registry's tools to any agent and run the calls.

`GET /v1/bridge/specs`: every tool of the registry with its Responses-format specs (function, and the
`custom` grammar form where the tool has one), its mode (parallel / sequential), its capability and
whether it can run here (enabled; a workspace for the file and shell tools). The proxy picks from it.
With `session` (or `task` and `agent`) in the query, the answer also lists under `carried` the names a
bridged request of that caller carries when tool discovery is on (`find_tools` and what the session
loaded, none of the other deferred tools), else `carried: null`; `only=carried` leaves the specs out
(the proxy fetches the specs once and asks this per request).

`POST /v1/bridge/call`: one model call as the model wrote it — a function call's raw `arguments` string
or a custom tool call's `input` — with the identity of the agent request it came from. Whatever goes
wrong with the call itself (malformed JSON, unknown fields, an unknown or disabled tool, a failing tool)
is the call's output, `is_error: true`, for the model to read: the turn goes on. Only a malformed
request to this endpoint is an HTTP error. The answer carries the result's images (`{mime_type, data}`,
base64) and, with discovery on, the caller's `carried` names after the call (a `find_tools` load shows in
the next round's tools).

The route and credentials of the agent's request (`upstream`) are put in the call's `CallContext` for
this one call, in memory, and never logged. A caller that hangs up cancels the call (the server runs
with aiohttp's handler cancellation: a shell command it started is stopped).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tools_server.discovery.family import FAMILY_KEY, key_of
from tools_server.metrics_endpoint import METRICS_KEY
from tools_server.registry import CallContext, Registry, Services, Tool, ToolError, ToolResult, UpstreamAccess, clip

log = logging.getLogger("ctproxy.tools")

WORKSPACE_CAPABILITIES = frozenset({"apply_patch", "shell"})


class BridgeUpstream(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str
    route_kind: str | None = None
    official: bool = False
    credentials_allowed: bool = False
    headers: dict[str, str] = Field(default_factory=dict)


class BridgeCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    kind: Literal["function", "custom"] = "function"
    arguments: str = ""  # function: the raw JSON text the model wrote
    input: str = ""  # custom: the freeform text
    call_id: str | None = None
    task: str | None = None
    agent: str | None = None
    session: str | None = None
    cwd: str | None = None
    upstream: BridgeUpstream | None = None


def availability(tool: Tool, services: Services) -> tuple[bool, str]:
    if not services.config.enabled(tool.capability):
        return False, f"{tool.capability}.enabled is false"
    if tool.capability in WORKSPACE_CAPABILITIES and services.workspace is None:
        return False, "no workspace (start ctproxy with --workspace DIR)"
    return True, ""


def spec_entries(registry: Registry, services: Services) -> list[dict[str, Any]]:
    out = []
    for tool in registry.all_tools():
        ok, why = availability(tool, services)
        out.append({"name": tool.name, "family": tool.family, "capability": tool.capability,
                    "parallel": tool.parallel, "read_only": tool.read_only, "available": ok, "reason": why,
                    "function": tool.function_spec(), "custom": tool.custom_spec()})
    return out


def parse_arguments(call: BridgeCall, tool: Tool) -> dict[str, Any]:
    """The call's arguments as the tool's executor takes them. A custom call's text is the tool's one
    freeform field (`apply_patch`: the patch)."""
    if call.kind == "custom":
        if tool.custom_format is None:
            raise ToolError(f"{tool.name} is a function tool: call it with JSON arguments")
        return {"input": call.input}
    text = call.arguments.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise ToolError(f"{tool.name}: the arguments are not valid JSON; send one JSON object of the fields "
                        "its schema lists") from None
    if not isinstance(value, dict):
        raise ToolError(f"{tool.name}: arguments must be a JSON object")
    return value


async def run_call(registry: Registry, services: Services, call: BridgeCall) -> ToolResult:
    tool = registry.get(call.name)
    if tool is None:
        known = ", ".join(sorted(t.name for t in registry.enabled_tools())) or "none"
        return ToolResult.from_error(ToolError(f"unknown or disabled tool '{clip(call.name, 80)}'; enabled tools: "
                                               f"{known}", code="unknown_tool"))
    ok, why = availability(tool, services)
    if not ok:
        return ToolResult.from_error(ToolError(f"{tool.name} cannot run here: {why}", code="unavailable"))
    up = call.upstream
    access = None if up is None else UpstreamAccess(
        base_url=up.base_url, route_kind=up.route_kind, official=up.official,
        credentials_allowed=up.credentials_allowed, headers=dict(up.headers) if up.credentials_allowed else {})
    ctx = CallContext(services=services, task=call.task, agent=call.agent, session=call.session,
                      call_id=call.call_id, cwd=Path(call.cwd) if call.cwd else None, transport="bridge",
                      upstream=access)
    try:
        arguments = parse_arguments(call, tool)
        return await tool.call(arguments, ctx)
    except ToolError as exc:  # arguments the schema refuses: the model reads why and may try again
        return ToolResult.from_error(exc)


def output_text(result: ToolResult) -> str:
    """What the model reads as the call's output: the text, or for an error the same JSON shape MCP
    clients get (`{"ok": false, "error": code, "message": …}`), so a failure is unmistakable."""
    if not result.is_error:
        return result.text
    return json.dumps(result.structured(), ensure_ascii=False)


def carried_names(services: Services, session: str | None, task: str | None, agent: str | None) -> list[str] | None:
    """The names a bridged request of this caller carries under tool discovery; None when discovery is
    off (or not served here): every available tool may then be offered."""
    family = services.extras.get(FAMILY_KEY)
    if family is None or not family.on:
        return None
    return family.carried_tool_names(key_of(session, task, agent))


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def add_routes(app: web.Application, registry_of: Any) -> None:
    """`registry_of(app) -> (Registry, Services)`: the app's tool service, looked up per request."""

    async def specs(request: web.Request) -> web.Response:
        registry, services = registry_of(request.app)
        q = request.query
        out: dict[str, Any] = {"object": "list"}
        if q.get("only") != "carried":
            out["data"] = spec_entries(registry, services)
        if "session" in q or "task" in q or "agent" in q:
            out["carried"] = carried_names(services, q.get("session") or None, q.get("task") or None,
                                           q.get("agent") or None)
        return web.json_response(out)

    async def call(request: web.Request) -> web.Response:
        registry, services = registry_of(request.app)
        try:
            body = BridgeCall.model_validate_json(await request.read())
        except ValidationError:
            return _error(400, "invalid_bridge_call", "the body must be a bridge call: {name, kind, arguments | "
                          "input, call_id, task, agent, session, cwd, upstream}")
        started = time.perf_counter()
        result = await run_call(registry, services, body)
        # The tool's name, outcome and time only: never arguments, outputs or the credentials.
        elapsed = time.perf_counter() - started
        log.debug("tool call name=%s transport=bridge error=%s ms=%.1f", body.name, result.is_error, elapsed * 1000)
        if (metrics := request.app.get(METRICS_KEY)) is not None:  # counted like REST and MCP calls
            metrics.observe_call(body.name, "bridge", elapsed, "error" if result.is_error else "ok",
                                 result.text if result.is_error else None, body.agent)
        return web.json_response({"output": output_text(result), "is_error": result.is_error,
                                  "error": result.details.get("error") if result.is_error else None,
                                  "images": [{"mime_type": i.mime_type, "data": i.data_base64}
                                             for i in result.images],
                                  "carried": carried_names(services, body.session, body.task, body.agent)})

    app.router.add_get("/v1/bridge/specs", specs)
    app.router.add_post("/v1/bridge/call", call)
