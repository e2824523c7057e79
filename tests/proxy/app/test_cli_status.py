"""`ctproxy status` describes the running processes, not the file (issue 10, point 8): a capability switched
in the config file while ctproxy runs is reported with what the proxy and tool server really do, and that a
restart applies the change."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp

from tests.support.cli import ctproxy as cli

REPO = Path(__file__).resolve().parents[3]




def status(state: Path) -> tuple[dict, dict[str, dict], str]:
    out = cli("status", "--json", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    text = cli("status", "--state-dir", str(state)).stdout
    return info, {c["name"]: c for c in info["capabilities"]}, text


def line_of(text: str, name: str) -> str:
    [line] = [line for line in text.splitlines() if line.strip().startswith(name + " ")]
    return line


async def _tool_names(proxy) -> set[str]:
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http, http.get(
            proxy.tools_url + "/v1/tools", headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200
        return {t["name"] for t in (await resp.json())["data"]}


async def test_a_switch_set_while_running_is_reported_as_needing_a_restart(proxy_factory, tmp_path):
    proxy = await proxy_factory(upstream="http://127.0.0.1:9")
    state = proxy.state_dir
    assert cli("config", "set", "shell.enabled", "true", "--state-dir", str(state)).returncode == 0
    assert cli("config", "set", "notes.enabled", "false", "--state-dir", str(state)).returncode == 0

    info, caps, text = status(state)
    assert info["proxy"]["pid"] == proxy.proc.pid
    # What the running processes do: no shell tools (the tool server answers 404), notes still served.
    tools = await _tool_names(proxy)
    assert "exec_command" not in tools and "notes_read_file" in tools
    assert caps["shell"]["state"] == "off"
    assert "config says enabled" in caps["shell"]["pending"] and "restart ctproxy" in caps["shell"]["pending"]
    assert caps["notes"]["state"] == "active"
    assert "config says disabled" in caps["notes"]["pending"]
    assert caps["history"]["pending"] == ""  # unchanged capabilities carry no note
    shell = line_of(text, "shell")
    assert " off " in shell and "config says enabled; restart ctproxy to apply" in shell
    assert "config says disabled; restart ctproxy to apply" in line_of(text, "notes")
    async with aiohttp.ClientSession() as http, http.post(
            proxy.tools_url + "/v1/tools/exec_command", json={"cmd": "true"},
            headers={"Authorization": f"Bearer {(state / 'token').read_text().strip()}"}) as resp:
        assert resp.status == 404  # consistent with what status says

    # After a restart the file is what runs, and status says so without a note.
    await proxy.astop()
    _, caps, text = status(state)
    assert caps["shell"]["state"] == "active" and caps["shell"]["pending"] == ""  # not running: the file
    again = await proxy_factory(upstream="http://127.0.0.1:9", state_dir=state,
                                extra_args=["--workspace", str(state.parent)])
    _, caps, text = status(state)
    assert caps["shell"]["state"] == "active" and caps["shell"]["pending"] == ""
    assert caps["notes"]["state"] == "off" and caps["notes"]["pending"] == ""
    assert "restart ctproxy to apply" not in text
    tools = await _tool_names(again)
    assert "exec_command" in tools and "notes_read_file" not in tools


async def test_this_runs_overrides_are_not_mistaken_for_a_changed_file(proxy_factory, tmp_path):
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=["--disable", "notes"])
    _, caps, text = status(proxy.state_dir)
    assert caps["notes"]["state"] == "off" and caps["notes"]["pending"] == ""
    assert "--disable notes" in caps["notes"]["reason"]
    assert "restart ctproxy to apply" not in text


async def test_the_tool_server_runs_the_proxys_config(proxy_factory, tmp_path):
    """Both processes run one snapshot of the config, taken once at start, and it is recorded in run.json."""
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=["--enable", "apply_patch"])
    run = json.loads((proxy.state_dir / "run.json").read_text())
    assert run["config"]["apply_patch"]["enabled"] is True
    assert "apply_patch" in await _tool_names(proxy)


async def test_a_tool_server_that_stopped_answering_is_reported(proxy_factory, tmp_path):
    import signal

    proxy = await proxy_factory(upstream="http://127.0.0.1:9")
    run = json.loads((proxy.state_dir / "run.json").read_text())
    pid = run["tools_pid"]
    os.kill(pid, signal.SIGKILL)
    for _ in range(600):  # until it is gone (a zombie: ctproxy has not reaped it), at most a minute
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split()[2] == "Z":
            break
        await asyncio.sleep(0.1)
    info, _, text = status(proxy.state_dir)
    assert info["tools_answering"] is False
    assert "not answering" in next(line for line in text.splitlines() if line.startswith("tools:"))


async def test_up_sandbox_reaches_the_tool_server_and_status_says_it(proxy_factory, tmp_path):
    """`ctproxy up --sandbox MODE` (issue 33): one run's mode, in the snapshot, the tool server and status alike."""
    ws = tmp_path / "ws"
    ws.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=[
        "--enable", "shell", "--sandbox", "danger-full-access", "--workspace", str(ws)])
    run = json.loads((proxy.state_dir / "run.json").read_text())
    assert run["config"]["shell"]["sandbox"] == "danger-full-access" and run["sandbox"] == "danger-full-access"
    _, caps, _ = status(proxy.state_dir)
    assert caps["shell"]["state"] == "active" and "unsandboxed" in caps["shell"]["reason"]
    assert caps["shell"]["pending"] == ""  # a flag of this run is not a changed file
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http, http.post(
            proxy.tools_url + "/v1/tools/exec_command", data=json.dumps({"cmd": f"echo x > {outside}/through"}),
            headers={"Authorization": f"Bearer {token}"}) as resp:
        assert resp.status == 200, await resp.text()
    assert (outside / "through").read_text() == "x\n"
