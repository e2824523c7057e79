"""Status, banner and request log tell the truth of the running proxy (issue 27, point 4): each claim is
checked against a real `ctproxy up`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from tests.emulator import Emulator
from tests.proxy.app.test_cli_status import _tool_names, status

SIX = ["computer_use_list_apps", "computer_use_get_app_state", "computer_use_click", "computer_use_type_text",
       "computer_use_press_key", "computer_use_scroll"]


def write_config(state: Path, config: dict) -> None:
    state.mkdir(parents=True, exist_ok=True)
    (state / "config.json").write_text(json.dumps(config))


async def call_tool(proxy, name: str, args: dict) -> tuple[int, dict]:
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http, http.post(
            f"{proxy.tools_url}/v1/tools/{name}", json=args, headers={"Authorization": f"Bearer {token}"}) as resp:
        return resp.status, await resp.json()


async def test_flags_given_to_up_are_never_pending_changes(proxy_factory):
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=["--bridge", "history", "--debug"])
    info, _, text = status(proxy.state_dir)
    assert info["pending"] == [], info["pending"]
    assert "pending:" not in text and "restart ctproxy to apply" not in text, text


async def test_the_banner_says_what_changes_requests(proxy_factory):
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=["--bridge", "history,notes"])
    [line] = [line for line in proxy.log().splitlines() if line.strip().startswith("requests ")]
    assert "web_search" in line and "context" in line and "remote_compaction" in line
    assert "bridge history, notes" in line
    plain = await proxy_factory(upstream="http://127.0.0.1:9")
    [line] = [line for line in plain.log().splitlines() if line.strip().startswith("requests ")]
    assert "bridge off" in line


async def test_the_request_log_names_the_bridge(proxy_factory):
    async with Emulator() as emu:
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "history"])
        async with aiohttp.ClientSession() as http, http.post(
                proxy.url + "/v1/responses", json={"model": "gpt-5", "input": "what did we say?"}) as resp:
            assert resp.status == 200
            await resp.read()
        names = [t.get("name") for t in emu.responses_requests[0].json.get("tools", [])]
        assert "history_search_contents" in names  # the bridge offered its tools
        deadline = asyncio.get_running_loop().time() + 60
        while "ctproxy-request POST /v1/responses" not in proxy.log():
            assert asyncio.get_running_loop().time() < deadline, proxy.log()
            await asyncio.sleep(0.05)
    [line] = [line for line in proxy.log().splitlines() if "ctproxy-request POST /v1/responses" in line]
    stages = line.split("stages=", 1)[1].split()[0].split(",")
    assert "bridge" in stages, line


async def test_credentialed_tools_without_a_key_behind_an_untrusted_upstream_are_unavailable(proxy_factory,
                                                                                               tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # ctproxy's environment has none
    state = tmp_path / "state"
    write_config(state, {"image_generation": {"enabled": True},
                         "web_search": {"enabled": True, "backend": "sidecar", "sidecar_model": "gpt-5-mini"}})
    proxy = await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9", trust_upstream=False)
    _, caps, _ = status(state)
    for name in ("image_generation", "sidecar_search"):
        assert caps[name]["state"] == "unavailable", caps[name]
        assert "OPENAI_API_KEY" in caps[name]["reason"] and "--trust-upstream" in caps[name]["reason"]
    tools = await _tool_names(proxy)
    assert "openai_generate_image" not in tools and "openai_web_search" not in tools
    code, body = await call_tool(proxy, "openai_generate_image", {"prompt": "a cat"})
    assert code == 503 and body["error"]["code"] == "unavailable", (code, body)
    assert "OPENAI_API_KEY" in body["error"]["message"]


async def test_the_same_tools_with_a_key_are_active(proxy_factory, tmp_path):
    state = tmp_path / "state"
    write_config(state, {"image_generation": {"enabled": True}})
    proxy = await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9", trust_upstream=False,
                                env={"OPENAI_API_KEY": "sk-from-the-environment"})
    _, caps, _ = status(state)
    assert caps["image_generation"]["state"] == "active"
    assert "openai_generate_image" in await _tool_names(proxy)


async def test_sidecar_backend_without_an_executor_is_not_offered(proxy_factory, tmp_path):
    state = tmp_path / "state"
    write_config(state, {"web_search": {"enabled": True, "backend": "sidecar"}})
    proxy = await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9")
    _, caps, _ = status(state)
    assert caps["sidecar_search"]["state"] == "unavailable"
    assert "openai_web_search" not in await _tool_names(proxy)


@pytest.mark.parametrize("setting", [{"policy": "no_such_module:hooks"}, {"shell": "/no/such/shell"}])
async def test_a_shell_that_cannot_run_is_unavailable_and_not_offered(proxy_factory, tmp_path, setting):
    state = tmp_path / "state"
    write_config(state, {"shell": {"enabled": True, **setting}})
    proxy = await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9",
                                extra_args=["--workspace", str(tmp_path)])
    _, caps, _ = status(state)
    assert caps["shell"]["state"] == "unavailable", caps["shell"]
    assert ("shell.policy" if "policy" in setting else "shell.shell") in caps["shell"]["reason"]
    tools = await _tool_names(proxy)
    assert "exec_command" not in tools and "write_stdin" not in tools


async def test_computer_use_held_by_discovery_is_deferred_not_active(proxy_factory, tmp_path):
    from tests.support import desktop

    if (missing := desktop.missing()) is not None:
        pytest.skip(missing)
    state = tmp_path / "state"
    write_config(state, {"computer_use": {"enabled": True, "start_xvfb": True},
                         "tool_discovery": {"enabled": True, "deferred": SIX}})
    await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9")
    _, caps, _ = status(state)
    assert caps["computer_use"]["state"] == "deferred", caps["computer_use"]
    assert "find_tools" in caps["computer_use"]["reason"]


async def test_deferred_means_only_held_back_behind_find_tools(proxy_factory, tmp_path):
    """A capability that merely starts on first use is `active`; every `deferred` names find_tools."""
    state = tmp_path / "state"
    write_config(state, {"computer_use": {"enabled": True, "start_xvfb": True}, "code_mode": {"enabled": True},
                         "tool_discovery": {"enabled": True, "deferred": ["exec", "wait"]}})
    await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9")
    _, caps, _ = status(state)
    assert caps["code_mode"]["state"] == "deferred"
    for cap in caps.values():
        if cap["state"] == "deferred":
            assert "held back by tool discovery until the model loads it with find_tools" in cap["reason"], cap
    assert caps["computer_use"]["state"] in ("active", "unavailable"), caps["computer_use"]



async def test_status_names_the_private_desktop_the_tool_server_started(proxy_factory, tmp_path, monkeypatch):
    """Seed 004 defect 14: once the tool server starts its private Xvfb desktop, `ctproxy status` (another
    process) names it; before, it says it starts on first use."""
    from tests.support import desktop

    if (missing := desktop.missing()) is not None:
        pytest.skip(missing)
    monkeypatch.delenv("DISPLAY", raising=False)
    state = tmp_path / "state"
    write_config(state, {"computer_use": {"enabled": True, "start_xvfb": True, "approval_mode": "always"}})
    proxy = await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9")
    _, caps, _ = status(state)
    assert caps["computer_use"]["state"] == "active" and "private desktop running" not in caps["computer_use"]["reason"]
    code, body = await call_tool(proxy, "computer_use_list_apps", {})
    assert code == 200 and body["ok"], body
    display = body["details"]["desktop"]["display"]
    _, caps, text = status(state)
    assert f"private desktop running on display {display}" in caps["computer_use"]["reason"]
    assert f"display {display}" in text


async def test_shell_and_code_mode_are_unavailable_while_the_tool_server_is_dead(proxy_factory, tmp_path):
    """seed004 N8: `active` means callable now; a dead tool server serves nothing."""
    import os
    import signal

    ws = tmp_path / "ws"
    ws.mkdir()
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", extra_args=[
        "--enable", "shell", "--enable", "code_mode", "--sandbox", "danger-full-access", "--workspace", str(ws)])
    _, caps, _ = status(proxy.state_dir)
    assert caps["shell"]["state"] == "active" and caps["code_mode"]["state"] == "active"
    pid = json.loads((proxy.state_dir / "run.json").read_text())["tools_pid"]
    os.kill(pid, signal.SIGKILL)
    for _ in range(600):  # until it is gone (or a zombie ctproxy has not reaped yet), at most a minute
        stat = Path(f"/proc/{pid}/stat")
        if not stat.exists() or stat.read_text().split()[2] == "Z":
            break
        await asyncio.sleep(0.1)
    _, caps, text = status(proxy.state_dir)
    for name in ("shell", "code_mode"):
        assert caps[name]["state"] == "unavailable", caps[name]
        assert "tool server is not answering" in caps[name]["reason"]
    assert "unavailable" in next(line for line in text.splitlines() if line.strip().startswith("shell "))


async def test_shell_policy_is_judged_by_the_running_server(proxy_factory, tmp_path):
    """seed004 N9: a policy module only the server's PYTHONPATH names loads there, so the shell works and
    status says active; a policy the server cannot load is unavailable for the server's reason."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "audhook.py").write_text("class Hooks:\n    def policy(self, call):\n        return None\n")
    ws = tmp_path / "ws"
    ws.mkdir()
    state = tmp_path / "state"
    write_config(state, {"shell": {"enabled": True, "policy": "audhook:Hooks", "sandbox": "danger-full-access"}})
    proxy = await proxy_factory(state_dir=state, upstream="http://127.0.0.1:9", extra_args=["--workspace", str(ws)],
                                env={"PYTHONPATH": str(hooks)})
    code, body = await call_tool(proxy, "exec_command", {"cmd": "echo ok"})
    assert code == 200 and body["details"]["stdout"]["text"] == "ok\n", body
    _, caps, _ = status(state)  # this process has no such PYTHONPATH
    assert caps["shell"]["state"] == "active", caps["shell"]
