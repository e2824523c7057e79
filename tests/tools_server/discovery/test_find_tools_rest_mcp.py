"""find_tools through the tool server (REST via aiohttp, MCP via the official client): query, load, reload,
errors before any change, per-session loads, and what the bridge would carry for each session."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mcp_types
import pytest

pytestmark = pytest.mark.timeout(120)

ON = {"tool_discovery.enabled": True, "tool_discovery.deferred": ["apply_patch"], "apply_patch.enabled": True,
      "shell.enabled": True}


async def test_off_by_default(tool_server: Any) -> None:
    srv = await tool_server()
    assert "find_tools" not in {s["name"] for s in await srv.list_rest()}
    assert (await srv.rest("find_tools", {"query": "patch"})).status == 404


async def test_query_load_reload_and_a_new_session(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    family = srv.services.extras["discovery.family"]
    found = await srv.rest("find_tools", {"query": "patch"}, task="a", agent="/root")
    assert found.ok and found.details["hits"][0] == {
        "name": "apply_patch", "status": "eligible", "summary": found.details["hits"][0]["summary"]}
    assert "apply_patch [eligible]" in found.text
    assert "apply_patch" not in family.carried_tool_names("agent:a//root")
    assert "find_tools" in family.carried_tool_names("agent:a//root")

    loaded = await srv.rest("find_tools", {"load": ["apply_patch", "no_such_tool", "exec_command"]},
                            task="a", agent="/root")
    assert loaded.ok and loaded.details["loaded"] == ["apply_patch"]
    assert loaded.details["already_active"] == ["exec_command"]
    assert loaded.details["rejected"] == [{"name": "no_such_tool",
                                           "reason": "not one of ctproxy's tools on this server"}]
    assert "apply_patch" in family.carried_tool_names("agent:a//root")

    again = await srv.rest("find_tools", {"load": ["apply_patch"], "query": "apply_patch"}, task="a", agent="/root")
    assert again.details["loaded"] == [] and again.details["already_active"] == ["apply_patch"]
    assert again.details["hits"][0]["status"] == "active"

    other = await srv.rest("find_tools", {"query": "apply_patch"}, task="b", agent="/root")
    assert other.details["hits"][0]["status"] == "eligible"  # a new session sees it held back again
    assert "apply_patch" not in family.carried_tool_names("agent:b//root")


async def test_errors_before_any_change(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    family = srv.services.extras["discovery.family"]
    neither = await srv.rest("find_tools", {}, task="a")
    assert neither.status == 400 and "give `query`" in neither.body["error"]["message"]
    malformed = await srv.rest("find_tools", {"load": "apply_patch"}, task="a")
    assert malformed.status == 400
    mixed = await srv.rest("find_tools", {"load": ["apply_patch", 3]}, task="a")
    assert mixed.status == 400
    assert family.loads("agent:a/") == frozenset()


async def test_unavailable_status_names_the_switch(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server({**ON, "shell.enabled": False, "tool_discovery.deferred": ["exec_command",
                                                                                       "write_stdin"]},
                            workspace=tmp_path)
    res = await srv.rest("find_tools", {"query": "exec_command", "load": ["exec_command"]}, task="a")
    assert res.details["hits"][0]["status"].startswith("unavailable: shell is off")
    assert res.details["loaded"] == [] and res.details["rejected"][0]["name"] == "exec_command"


async def test_switching_discovery_off_forgets_loads(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    family = srv.services.extras["discovery.family"]
    await srv.rest("find_tools", {"load": ["apply_patch"]}, task="a", agent="/root")
    assert family.loads("agent:a//root") == {"apply_patch"}
    srv.services.config.tool_discovery.enabled = False
    assert "apply_patch" in family.carried_tool_names("agent:a//root")  # off: nothing is held back
    assert "find_tools" not in family.carried_tool_names("agent:a//root")
    srv.services.config.tool_discovery.enabled = True
    assert family.loads("agent:a//root") == frozenset()  # re-enabled: held back again


async def test_mcp_find_tools(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    assert "find_tools" in {t.name for t in await srv.mcp_list()}
    res = await srv.mcp("find_tools", {"query": "shell"}, task="a", agent="/root")
    assert not res.is_error and res.structured is not None
    names = [h["name"] for h in res.structured["hits"]]
    assert "exec_command" in names and len(names) <= 8
    bad = await srv.mcp("find_tools", {})
    assert bad.is_error


async def _rest_names(srv: Any, task: str, agent: str) -> set[str]:
    import aiohttp

    async with aiohttp.ClientSession() as http, http.get(f"{srv.url}/v1/tools",
                                                         headers=srv.headers(task, agent)) as resp:
        assert resp.status == 200
        return {s["name"] for s in (await resp.json())["data"]}


async def test_rest_lists_and_calls_only_what_the_caller_loaded(tool_server: Any, tmp_path: Path) -> None:
    """Seed 004 defect 6: `GET /v1/tools` follows the caller's loads and a deferred tool it has not loaded is
    refused with a clear error; after `find_tools load` it is listed and callable, for that caller only."""
    srv = await tool_server(ON, workspace=tmp_path)
    patch = "*** Begin Patch\n*** Add File: made.txt\n+x\n*** End Patch"
    assert "apply_patch" not in await _rest_names(srv, "a", "/root")
    held = await srv.rest("apply_patch", {"patch": patch}, task="a", agent="/root")
    assert held.status == 404 and held.body["error"]["code"] == "not_loaded"
    assert 'find_tools with {"load": ["apply_patch"]}' in held.body["error"]["message"]
    assert not (tmp_path / "made.txt").exists()
    loaded = await srv.rest("find_tools", {"load": ["apply_patch"]}, task="a", agent="/root")
    assert loaded.ok and loaded.details["loaded"] == ["apply_patch"]
    assert "apply_patch" in await _rest_names(srv, "a", "/root")
    assert "apply_patch" not in await _rest_names(srv, "b", "/root")  # another caller's loads are its own
    assert (await srv.rest("apply_patch", {"patch": patch}, task="a", agent="/root")).ok
    assert (tmp_path / "made.txt").read_text() == "x\n"
    other = await srv.rest("apply_patch", {"patch": patch}, task="b", agent="/root")
    assert other.status == 404 and other.body["error"]["code"] == "not_loaded"


async def test_mcp_session_lists_and_calls_what_it_loaded(tool_server: Any, tmp_path: Path) -> None:
    """The same over MCP: one MCP session is one discovery session (its `tools/list` and its calls)."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    srv = await tool_server(ON, workspace=tmp_path)
    patch = "*** Begin Patch\n*** Add File: made.txt\n+x\n*** End Patch"
    told = asyncio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, mcp_types.ToolListChangedNotification):
            told.set()

    async with srv._mcp_client(None, None, None) as client, streamable_http_client(
            f"{srv.url}/mcp", http_client=client) as (read, write), ClientSession(
                read, write, message_handler=on_message) as session:
        init = await session.initialize()
        assert init.capabilities.tools is not None and init.capabilities.tools.list_changed
        assert "apply_patch" not in {t.name for t in (await session.list_tools()).tools}
        held = await session.call_tool("apply_patch", {"patch": patch})
        assert held.is_error and held.structured_content["error"] == "not_loaded"
        assert not (tmp_path / "made.txt").exists()
        loaded = await session.call_tool("find_tools", {"load": ["apply_patch"]})
        assert not loaded.is_error and loaded.structured_content["loaded"] == ["apply_patch"]
        await asyncio.wait_for(told.wait(), 60)  # the session is told its tools changed
        assert "apply_patch" in {t.name for t in (await session.list_tools()).tools}
        done = await session.call_tool("apply_patch", {"patch": patch})
        assert not done.is_error, done.content
    assert (tmp_path / "made.txt").read_text() == "x\n"
    assert "apply_patch" not in {t.name for t in await srv.mcp_list()}  # a new MCP session starts afresh


CU_GROUP = ["computer_use_list_apps", "computer_use_get_app_state", "computer_use_click", "computer_use_type_text",
            "computer_use_press_key", "computer_use_scroll"]


async def test_find_tools_agrees_with_status_on_computer_use(tool_server: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 004 defect 10: while `ctproxy status` says computer_use is unavailable (here: no X display),
    find_tools never calls its tools eligible nor loads them, and says why."""
    from proxy.app.status import computer_use_status

    monkeypatch.delenv("DISPLAY", raising=False)
    srv = await tool_server({"tool_discovery.enabled": True, "tool_discovery.deferred": CU_GROUP,
                             "computer_use.enabled": True, "computer_use.start_xvfb": False,
                             "computer_use.display": None}, workspace=tmp_path)
    state, reason = computer_use_status(srv.services.config)
    assert state == "unavailable" and "no X display" in reason
    res = await srv.rest("find_tools", {"query": "computer_use", "load": ["computer_use_click"]}, task="a")
    statuses = {h["name"]: h["status"] for h in res.details["hits"] if h["name"] in CU_GROUP}
    assert statuses and all(s.startswith("unavailable: ") and "no X display" in s for s in statuses.values())
    assert res.details["loaded"] == [] and res.details["rejected"][0]["name"] == "computer_use_click"
    assert "[eligible]" not in res.text
