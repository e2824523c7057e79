"""The MCP streamable-HTTP endpoint: the official `mcp` SDK's session manager mounted at /mcp."""

from __future__ import annotations

import asyncio
import base64
import logging
from typing import Any

import mcp_types as types
from aiohttp import web
from aiohttp_asgi import ASGIResource
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.models import InitializationOptions
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from proxy import __version__
from tools_server.computer_use.approval import mcp_confirm_for
from tools_server.registry import CallContext, ToolError, ToolResult
from tools_server.service import ToolService

log = logging.getLogger("ctproxy.tools")


def _context(service: ToolService, ctx: Any) -> CallContext:
    """The call context of one MCP request. Its discovery session is the MCP session (`mcp-session-id`):
    what a client loads with `find_tools` shows in that session's `tools/list` and may be called there."""
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None) or {}
    mcp_session = headers.get("mcp-session-id")
    return service.context(transport="mcp", task=headers.get("x-ctp-task"), agent=headers.get("x-ctp-agent"),
                           cwd=headers.get("x-ctp-cwd"), session=f"mcp:{mcp_session}" if mcp_session else None,
                           # a client that declared elicitation can be asked for approvals (Computer Use,
                           # code mode's patches)
                           confirm=mcp_confirm_for(ctx))


def build_mcp_server(service: ToolService) -> Server:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        tools = [
            types.Tool(name=t.name, description=t.description, input_schema=t.json_schema(),
                       annotations=types.ToolAnnotations(read_only_hint=t.read_only))
            for t in service.visible_tools(_context(service, ctx))
        ]
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        try:
            result = await service.call(params.name, dict(params.arguments or {}), _context(service, ctx))
            if result.details.get("loaded") and params.name == "find_tools":
                await _say_the_list_changed(ctx)
            return _to_mcp(result)
        except ToolError as exc:
            return _to_mcp(ToolResult.from_error(exc))
        except Exception as exc:  # not from a tool (those are caught on the road): still one line, no 500
            log.warning("MCP tool call failed unexpectedly: %s", type(exc).__name__)
            return _to_mcp(ToolResult.from_error(ToolError(
                f"the tool call failed with an internal error ({type(exc).__name__}); its effect is unknown",
                code="internal_error")))

    return _ListChangingServer("ctproxy", version=__version__, on_list_tools=list_tools, on_call_tool=call_tool)


class _ListChangingServer(Server):
    """Says `tools.listChanged` at the handshake: a `find_tools` load changes this MCP session's tools/list,
    and the session is told so (`notifications/tools/list_changed`) instead of having to poll."""

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> InitializationOptions:
        return super().create_initialization_options(
            notification_options or NotificationOptions(tools_changed=True), *args, **kwargs)


async def _say_the_list_changed(ctx: Any) -> None:
    session = getattr(ctx, "session", None)
    if session is None:
        return
    try:
        await session.send_tool_list_changed()
    except Exception as exc:  # a client gone or a channel without notifications: the load itself stands
        log.info("MCP tools/list_changed not delivered: %s", type(exc).__name__)


def _to_mcp(result: ToolResult) -> types.CallToolResult:
    """Text (and images) as content; `structuredContent` carries the details, and for an error its code
    and explanation (Codex CLI gives the model only the structured part when there is one)."""
    content: list[Any] = [types.TextContent(type="text", text=result.text)]
    for image in result.images:
        try:
            base64.b64decode(image.data_base64, validate=True)
        except ValueError:
            # never hand a client broken image data
            content.append(types.TextContent(type="text", text="[an image was left out: its data is not base64]"))
            continue
        content.append(types.ImageContent(type="image", data=image.data_base64, mime_type=image.mime_type))
    return types.CallToolResult(content=content, structured_content=result.structured(), is_error=result.is_error)


def tracked_send(send: Any, finished: asyncio.Event) -> Any:
    """The ASGI `send` the SDK gets: it stops at the end of the body, and a client that closed its connection
    while an SSE answer was still being written ends the answer quietly. (The SDK logged each such write as an
    `SSE response error` with a 60-line traceback: seed004 old 20.)"""

    async def send_and_track(message: dict[str, Any]) -> None:
        if finished.is_set():
            return  # the client went away (or the body is complete): nowhere to deliver it
        try:
            await send(message)
        except ConnectionResetError:  # aiohttp's ClientConnectionResetError: "Cannot write to closing transport"
            finished.set()
            log.debug("MCP: the client closed its connection before the answer's end")
            return
        if message.get("type") == "http.response.body" and not message.get("more_body"):
            finished.set()

    return send_and_track


def mount_mcp(app: web.Application, service: ToolService) -> None:
    manager = StreamableHTTPSessionManager(
        build_mcp_server(service),
        # SSE answers: a request's own stream is the only channel that carries a server-initiated request
        # (elicitation, for approvals) during a tool call; JSON answers have none (the SDK says so:
        # `can_send_request` is False in that mode and the request is dropped).
        json_response=False,
        # Host/Origin checks and the bearer token are enforced by our aiohttp middleware.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )

    lingering: set[asyncio.Future[None]] = set()  # requests still finishing after their client hung up

    def _settled(task: asyncio.Future[None]) -> None:
        lingering.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.warning("MCP request failed after its client hung up: %s", type(exc).__name__)

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http":
            await manager.handle_request(scope, receive, send)
            return
        # aiohttp-asgi answers every `receive()` after the body with an empty body at once, so code that
        # waits for `http.disconnect` (sse-starlette) spins and starves the loop. After the body, make
        # `receive()` wait until the response has been sent, as ASGI servers do.
        body_done = False
        finished = asyncio.Event()

        async def receive_body_then_wait() -> dict[str, Any]:
            nonlocal body_done
            if not body_done:
                message = await receive()
                if message.get("type") != "http.request" or not message.get("more_body"):
                    body_done = True
                return message
            await finished.wait()
            return {"type": "http.disconnect"}

        send_and_track = tracked_send(send, finished)

        # aiohttp cancels a handler whose client hung up, even one that has sent its whole answer; the SDK
        # takes a cancelled opening request for a failed one and drops the new session, and an SSE answer is
        # still winding down right after its last byte. ASGI servers instead tell the app `http.disconnect`
        # and let it finish: do the same, running the app in its own task.
        handling = asyncio.ensure_future(manager.handle_request(scope, receive_body_then_wait, send_and_track))
        try:
            await asyncio.shield(handling)
        except asyncio.CancelledError:
            finished.set()  # receive() now answers http.disconnect
            if not handling.done():
                lingering.add(handling)
                handling.add_done_callback(_settled)
            raise
        finally:
            finished.set()

    app.router.register_resource(ASGIResource(asgi, root_path="/mcp"))

    async def lifecycle(_: web.Application) -> Any:
        started = asyncio.Event()
        stop = asyncio.Event()

        async def runner() -> None:
            async with manager.run():
                started.set()
                await stop.wait()

        task = asyncio.create_task(runner())
        await started.wait()
        yield
        for pending in list(lingering):
            pending.cancel()
        await asyncio.gather(*lingering, return_exceptions=True)
        stop.set()
        await task

    app.cleanup_ctx.append(lifecycle)
