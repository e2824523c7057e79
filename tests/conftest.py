"""Fixtures shared by the whole suite."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.toolserver import ToolServerHandle, make_services


@pytest.fixture
async def tool_server(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory: `srv = await tool_server({"shell.enabled": True}, workspace=path)` starts the tool server
    app on a loopback port; `srv.rest(name, args, task=, agent=)`, `srv.mcp(name, args, ...)` call it."""
    handles: list[ToolServerHandle] = []

    async def start(overrides: dict[str, Any] | None = None, workspace: Path | None = None) -> ToolServerHandle:
        services = make_services(tmp_path / f"ts{len(handles)}", overrides, workspace)
        handle = ToolServerHandle(services, services.state.token())
        await handle.start()
        handles.append(handle)
        return handle

    yield start
    for h in handles:
        await h.close()
