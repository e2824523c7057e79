"""Run the tool server app in-process on a loopback port and call it over REST and the official MCP client."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx2
from aiohttp import web
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from proxy.config import Config, set_key
from proxy.state import StateDir
from tools_server.app import bind_port, create_app
from tools_server.registry import Services


@dataclass
class RestResult:
    status: int
    body: dict[str, Any]

    @property
    def text(self) -> str:
        return self.body.get("text", "")

    @property
    def details(self) -> dict[str, Any]:
        return self.body.get("details", {})

    @property
    def ok(self) -> bool:
        return self.status == 200 and bool(self.body.get("ok"))


@dataclass
class McpResult:
    text: str
    is_error: bool
    structured: dict[str, Any] | None
    content: list[Any] = field(default_factory=list)


class ToolServerHandle:
    def __init__(self, services: Services, token: str):
        self.services = services
        self.token = token
        self.runner: web.AppRunner | None = None
        self.port = 0
        self.app: web.Application | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def headers(self, task: str | None = None, agent: str | None = None, cwd: str | None = None) -> dict[str, str]:
        h = {"Authorization": f"Bearer {self.token}"}
        if task:
            h["x-ctp-task"] = task
        if agent:
            h["x-ctp-agent"] = agent
        if cwd:
            h["x-ctp-cwd"] = cwd
        return h

    async def start(self) -> None:
        self.app = create_app(self.services, token=self.token, listen_host="127.0.0.1", port=None)
        self.runner = web.AppRunner(self.app, access_log=None, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        bind_port(self.app, self.port)

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def rest(self, name: str, arguments: Any, *, task: str | None = None, agent: str | None = None,
                   cwd: str | None = None) -> RestResult:
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.url}/v1/tools/{name}", data=json.dumps(arguments), headers=self.headers(task, agent, cwd)
        ) as resp:
            return RestResult(resp.status, await resp.json())

    async def list_rest(self, fmt: str = "function") -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http, http.get(
            f"{self.url}/v1/tools", params={"format": fmt}, headers=self.headers()
        ) as resp:
            resp.raise_for_status()
            return (await resp.json())["data"]

    def _mcp_client(self, task: str | None, agent: str | None, cwd: str | None) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(headers=self.headers(task, agent, cwd),
                                  timeout=httpx2.Timeout(30.0, read=300.0))

    async def mcp(self, name: str, arguments: dict[str, Any], *, task: str | None = None,
                  agent: str | None = None, cwd: str | None = None) -> McpResult:
        async with self._mcp_client(task, agent, cwd) as client, streamable_http_client(
            f"{self.url}/mcp", http_client=client
        ) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            result = await session.call_tool(name, arguments)
            texts = [c.text for c in result.content if getattr(c, "type", "") == "text"]
            return McpResult("\n".join(texts), bool(result.is_error), result.structured_content, list(result.content))

    async def mcp_list(self) -> list[Any]:
        async with self._mcp_client(None, None, None) as client, streamable_http_client(
            f"{self.url}/mcp", http_client=client
        ) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return list((await session.list_tools()).tools)


def make_services(tmp: Path, overrides: dict[str, Any] | None = None, workspace: Path | None = None) -> Services:
    config = Config()
    for key, value in (overrides or {}).items():
        config = set_key(config, key, json.dumps(value))
    state = StateDir.open(tmp / "state")
    ws = workspace or (tmp / "workspace")
    ws.mkdir(parents=True, exist_ok=True)
    return Services(config=config, state=state, workspace=ws.resolve())
