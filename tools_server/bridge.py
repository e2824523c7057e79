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

Each call takes the one road (tools_server/service.py: discovery, the policy seam, the journal). The
route and credentials of the agent's request (`upstream`) are put in the call's `CallContext` for
this one call, in memory, and never logged. A caller that hangs up cancels the call (the server runs
with aiohttp's handler cancellation: a shell command it started is stopped).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tools_server.discovery.family import FAMILY_KEY, key_of
from tools_server.registry import Registry, Services, Tool, ToolError, ToolResult, UpstreamAccess
from tools_server.service import ToolService, availability


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


async def run_call(service: ToolService, call: BridgeCall) -> ToolResult:
    """One bridged call on the one road; whatever goes wrong is the call's output for the model."""
    up = call.upstream
    access = None if up is None else UpstreamAccess(
        base_url=up.base_url, route_kind=up.route_kind, official=up.official,
        credentials_allowed=up.credentials_allowed, headers=dict(up.headers) if up.credentials_allowed else {})
    ctx = service.context(transport="bridge", task=call.task, agent=call.agent, session=call.session,
                          call_id=call.call_id, cwd=call.cwd, upstream=access)
    tool = service.registry.get(call.name)  # a custom call's text is read by the tool's own form
    try:
        # JSON the model got wrong never reaches the road (as a REST body that is not JSON); the road
        # refuses an unknown or not loaded tool and arguments the schema refuses, and journals it
        return await service.call(call.name, parse_arguments(call, tool) if tool is not None else {}, ctx)
    except ToolError as exc:  # unknown, not loaded, arguments the schema refuses: the model reads why
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


def add_routes(app: web.Application, service_of: Any) -> None:
    """`service_of(app) -> ToolService`: the app's tool service, looked up per request."""

    async def specs(request: web.Request) -> web.Response:
        service = service_of(request.app)
        registry, services = service.registry, service.services
        q = request.query
        out: dict[str, Any] = {"object": "list"}
        if q.get("only") != "carried":
            out["data"] = spec_entries(registry, services)
        if "session" in q or "task" in q or "agent" in q:
            out["carried"] = carried_names(services, q.get("session") or None, q.get("task") or None,
                                           q.get("agent") or None)
        return web.json_response(out)

    async def call(request: web.Request) -> web.Response:
        service = service_of(request.app)
        try:
            body = BridgeCall.model_validate_json(await request.read())
        except ValidationError:
            return _error(400, "invalid_bridge_call", "the body must be a bridge call: {name, kind, arguments | "
                          "input, call_id, task, agent, session, cwd, upstream}")
        result = await run_call(service, body)  # journaled on the road, like every other call
        services = service.services
        return web.json_response({"output": output_text(result), "is_error": result.is_error,
                                  "error": result.details.get("error") if result.is_error else None,
                                  "images": [{"mime_type": i.mime_type, "data": i.data_base64}
                                             for i in result.images],
                                  "carried": carried_names(services, body.session, body.task, body.agent)})

    app.router.add_get("/v1/bridge/specs", specs)
    app.router.add_post("/v1/bridge/call", call)
