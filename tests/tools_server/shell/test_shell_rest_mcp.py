"""exec_command / write_stdin end to end through the tool server's REST and MCP endpoints."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tools_server.shell.procgroup import live_members

pytestmark = pytest.mark.timeout(120)

ENABLE = {"shell.enabled": True}


async def test_rest_listing_has_both_tools_together(tool_server: Any) -> None:
    srv = await tool_server(ENABLE)
    names = {s["name"]: s for s in await srv.list_rest()}
    assert {"exec_command", "write_stdin"} <= set(names)
    assert names["exec_command"]["parameters"]["required"] == ["cmd"]
    assert "no PTY" in names["exec_command"]["description"]
    off = await tool_server({"shell.enabled": False})
    assert not {"exec_command", "write_stdin"} & {s["name"] for s in await off.list_rest()}


async def test_rest_session_round_trip(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ENABLE, workspace=tmp_path)
    first = await srv.rest("exec_command", {"cmd": "cat", "yield_time_ms": 250}, task="t", agent="/root")
    assert first.ok, first.body
    sid = first.details["session_id"]
    assert f"Process running with session ID {sid}" in first.text
    second = await srv.rest("write_stdin", {"session_id": int(sid), "chars": "ping\n", "yield_time_ms": 2000},
                          task="t", agent="/root")
    assert second.ok and second.details["stdout"]["text"] == "ping\n"
    other = await srv.rest("write_stdin", {"session_id": sid}, task="intruder", agent="/root")
    assert not other.ok and other.body["details"]["error"] == "stale-session"
    done = await srv.rest("write_stdin", {"session_id": sid, "closeStdin": True, "yield_time_ms": 2000},
                          task="t", agent="/root")
    assert done.ok and done.details["exit_code"] == 0
    assert "Process exited with code 0" in done.text


async def test_rest_refusal_is_an_error_result(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ENABLE, workspace=tmp_path)
    res = await srv.rest("exec_command", {"cmd": "touch x", "command": "touch y"})
    assert not res.ok and res.body["details"]["error"] == "conflicting-alias"
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


async def test_mcp_exec_and_structured_details(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ENABLE, workspace=tmp_path)
    res = await srv.mcp("exec_command", {"cmd": "printf 'a\\nb\\n'; exit 4"}, task="t", agent="/root")
    assert not res.is_error
    assert "Process exited with code 4" in res.text and res.text.endswith("Output:\na\nb\n")
    assert res.structured is not None and res.structured["exit_code"] == 4
    assert res.structured["stdout"]["text"] == "a\nb\n"
    bad = await srv.mcp("exec_command", {"cmd": "true", "tty": True})
    assert bad.is_error and "PTY" in bad.text


async def test_no_process_left_after_the_tool_server_stops(tool_server: Any, tmp_path: Path) -> None:
    # the process group of danger-full-access (a sandboxed job's processes live in its own pid namespace)
    srv = await tool_server({**ENABLE, "shell.kill_after_ms": 500, "shell.sandbox": "danger-full-access"},
                            workspace=tmp_path)
    res = await srv.rest("exec_command", {"cmd": "trap '' TERM; sleep 1000 & sleep 1000 & echo up; wait",
                                          "yield_time_ms": 500})
    assert res.ok and res.details["stdout"]["text"] == "up\n"
    path = Path(res.details["recovery"]["stdout"]["path"])
    family = srv.services.extras["shell.family"]
    job = family.manager._jobs[res.details["session_id"]]
    assert len(await asyncio.to_thread(live_members, job.pgid)) >= 3
    await srv.close()
    assert await asyncio.to_thread(live_members, job.pgid) == []
    assert not path.exists()


async def test_rest_client_hanging_up_stops_the_command_it_started(tool_server: Any, tmp_path: Path) -> None:
    import json
    import os

    import aiohttp

    srv = await tool_server({**ENABLE, "shell.sandbox": "danger-full-access"}, workspace=tmp_path)  # host pid
    pidfile = tmp_path / "pid"
    args = {"cmd": f"echo $$ > {pidfile}; exec sleep 60", "yield_time_ms": 20000}
    async with aiohttp.ClientSession() as http:
        with pytest.raises(asyncio.TimeoutError):
            async with http.post(f"{srv.url}/v1/tools/exec_command", data=json.dumps(args),
                                 headers=srv.headers("t", "/root"), timeout=aiohttp.ClientTimeout(total=1.5)) as r:
                await r.read()
    pid = int(pidfile.read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break  # a zombie: stopped, waiting for its reaper
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("the command kept running after its caller hung up")
