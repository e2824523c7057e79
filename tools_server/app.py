"""The aiohttp tool server: REST (`GET /v1/tools`, `POST /v1/tools/{name}`), `/healthz`, MCP at `/mcp`."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from proxy import __version__
from tools_server.bridge import add_routes as add_bridge_routes
from tools_server.codex_backend import add_routes as add_codex_backend_routes
from tools_server.context import add_context_routes
from tools_server.credentials import add_routes as add_credential_routes
from tools_server.families import build_registry
from tools_server.mcp_endpoint import mount_mcp
from tools_server.metrics_endpoint import ProxyTelemetry, ToolMetrics, mount_metrics
from tools_server.registry import CallContext, Services, ToolError
from tools_server.security import security_middleware
from tools_server.service import ToolService

SERVICE_KEY = web.AppKey("tool_service", ToolService)
PORT_KEY = web.AppKey("listen_port", list)
log = logging.getLogger("ctproxy.tools")


def _json_error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


@web.middleware
async def json_errors(request: web.Request,
                      handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Every error this server answers is JSON: aiohttp's own (404, 405, 413) and anything unexpected,
    which is logged as one line (its type only: never the request, its headers or its body)."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_") if exc.reason else "http_error"
        return _json_error(exc.status, code, f"{exc.status} {exc.reason}: {request.method} {request.path[:200]}")
    except Exception as exc:
        log.warning("tool server request failed unexpectedly: %s %s: %s", request.method, request.path[:100],
                    type(exc).__name__)
        return _json_error(500, "internal_error", f"the tool server failed with an internal error "
                           f"({type(exc).__name__}); the request's effect is unknown")


async def healthz(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    # `unavailable`: the capabilities this process judged unusable, and why (its shell.policy import, its PATH):
    # `ctproxy status` reports these, not its own judgement (seed004 N9)
    return web.json_response({"ok": True, "version": __version__,
                              "tools": [t.name for t in service.registry.enabled_tools()],
                              "unavailable": dict(service.registry.unavailable)})


def rest_context(service: ToolService, request: web.Request) -> CallContext:
    headers = request.headers
    return service.context(transport="rest", task=headers.get("x-ctp-task"), agent=headers.get("x-ctp-agent"),
                           cwd=headers.get("x-ctp-cwd"), call_id=headers.get("x-ctp-call-id"))


async def list_tools(request: web.Request) -> web.Response:
    """The tools this caller may call now: with tool discovery on, the deferred ones it has not loaded
    (`find_tools` with `load`, by the same x-ctp-task / x-ctp-agent) are not listed."""
    service = request.app[SERVICE_KEY]
    fmt = request.query.get("format", "function")
    if fmt not in ("function", "custom"):
        return _json_error(400, "invalid_format", "format must be 'function' or 'custom'")
    specs: list[dict[str, Any]] = []
    for tool in service.visible_tools(rest_context(service, request)):
        spec = tool.custom_spec() if fmt == "custom" else None
        specs.append(spec or tool.function_spec())
    return web.json_response({"object": "list", "data": specs})


async def call_tool(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    name = request.match_info["name"]
    try:
        raw = await request.read()
        arguments = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):  # not JSON, not UTF-8, or nested too deeply to parse
        return _json_error(400, "invalid_json", "the body must be a JSON object of tool arguments")
    if not isinstance(arguments, dict):
        return _json_error(400, "invalid_arguments", "the body must be a JSON object of tool arguments")
    try:
        result = await service.call(name, arguments, rest_context(service, request))
    except ToolError as exc:
        status = {"unknown_tool": 404, "not_loaded": 404, "unavailable": 503}.get(exc.code, 400)
        return _json_error(status, exc.code, exc.message)
    return web.json_response(result.to_json())


def create_app(services: Services, *, token: str, listen_host: str = "127.0.0.1",
               port: int | None = None, proxy_telemetry: str | None = None) -> web.Application:
    """With `port=None` (a test server on a random port) call `bind_port` once the port is known;
    until then any loopback Host is accepted. `proxy_telemetry`: the proxy's loopback telemetry URL
    (proxy/app/telemetry.py), for `/metrics` and the dashboard's live requests."""
    from tools_server.ui import UISessions, mount_ui, ui_gate

    port_box: list[int | None] = [port]
    security = security_middleware(token, listen_host, lambda: port_box[0])
    ui_sessions = UISessions()
    # /ui/ (the dashboard) gets the loopback rules with a cookie session instead of a bearer on each request.
    app = web.Application(middlewares=[json_errors, ui_gate(security, ui_sessions, token, listen_host,
                                                            lambda: port_box[0])],
                          client_max_size=64 * 1024 * 1024)
    app[PORT_KEY] = port_box
    registry = build_registry(services)
    metrics = ToolMetrics(lambda: {t.name for t in registry.enabled_tools()})
    service = ToolService(services, registry, journal=metrics)  # every road's calls, counted
    app[SERVICE_KEY] = service
    mount_metrics(app, metrics, ProxyTelemetry(proxy_telemetry, token))
    mount_ui(app, ui_sessions, services, registry)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/tools", list_tools)
    app.router.add_post("/v1/tools/{name}", call_tool)
    add_bridge_routes(app, lambda a: a[SERVICE_KEY])  # the proxy's bridge
    add_codex_backend_routes(app, lambda a: a[SERVICE_KEY])  # Codex alpha/…
    add_credential_routes(app, lambda a: a[SERVICE_KEY].services.session_credentials)  # the proxy's hand-over
    add_context_routes(app, lambda a: a[SERVICE_KEY].services)  # POST /v1/context/checkpoint (manual checkpoint)
    mount_mcp(app, service)

    async def close_registry(_: web.Application) -> None:
        await service.registry.close()
        if services.store is not None:  # (after the families: nothing calls the store any more)
            services.store.close()

    app.on_cleanup.append(close_registry)
    return app


def bind_port(app: web.Application, port: int) -> None:
    app[PORT_KEY][0] = port
