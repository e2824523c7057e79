"""`ctproxy codex-config` (issue 10, point 15): Codex CLI through ctproxy, with the tool server as its MCP
server, in one step. The printed TOML is read back with tomllib; `--write` merges into an existing
config.toml; and the real Codex CLI (0.169, installed in .tools/ by scripts/bootstrap.sh) runs a turn with
the written file that calls a ctproxy tool over MCP under the right task and agent."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import tomllib
from pathlib import Path

import aiohttp
import pytest

from tests.emulator import Emulator, FunctionCall, Text
from tests.support.cli import ctproxy as cli
from tests.support.codex import codex_binary

REPO = Path(__file__).resolve().parents[3]




def _known_tasks(state: Path) -> str:
    out = cli("tasks", "--state-dir", str(state))
    assert out.returncode == 0, out.stderr
    return out.stdout


async def test_printed_entries_point_at_the_running_proxy_and_tool_server(proxy_factory):
    proxy = await proxy_factory(upstream="http://127.0.0.1:9")
    out = await asyncio.to_thread(cli, "codex-config", "--state-dir", str(proxy.state_dir))
    assert out.returncode == 0, out.stderr
    data = tomllib.loads(out.stdout)
    token = (proxy.state_dir / "token").read_text().strip()
    assert data["model_provider"] == "ctproxy"
    provider = data["model_providers"]["ctproxy"]
    assert provider["base_url"] == proxy.url + "/v1" and provider["wire_api"] == "responses"
    assert provider["env_key"] == "OPENAI_API_KEY"
    mcp = data["mcp_servers"]["ctproxy"]
    assert mcp["url"] == proxy.tools_url + "/mcp"
    assert mcp["http_headers"]["Authorization"] == f"Bearer {token}"
    assert mcp["default_tools_approval_mode"] == "approve"
    # The same identity on both: the model's traffic and the tools' calls land in one task and agent.
    task = provider["http_headers"]["x-ctp-task"]
    assert provider["http_headers"] == {"x-ctp-task": task, "x-ctp-agent": "/root"}
    assert {k: v for k, v in mcp["http_headers"].items() if k != "Authorization"} == provider["http_headers"]
    assert f"task {task}" in _known_tasks(proxy.state_dir)  # a real task: the proxy accepts it


def test_without_a_running_proxy_the_defaults_are_used_and_said(tmp_path):
    out = cli("codex-config", "--state-dir", str(tmp_path / "state"), "--task", "task_given", "--agent", "/root/rev",
              "--token-env", "CTPROXY_TOKEN")
    assert out.returncode == 0, out.stderr
    assert "not running" in out.stderr
    data = tomllib.loads(out.stdout)
    assert data["model_providers"]["ctproxy"]["base_url"] == "http://127.0.0.1:8787/v1"
    mcp = data["mcp_servers"]["ctproxy"]
    assert mcp["url"] == "http://127.0.0.1:8788/mcp" and mcp["bearer_token_env_var"] == "CTPROXY_TOKEN"
    assert "Authorization" not in mcp["http_headers"]
    assert mcp["http_headers"] == {"x-ctp-task": "task_given", "x-ctp-agent": "/root/rev"}
    assert "ctp_" not in out.stdout  # the token stays out of the file when read from the environment

    chatgpt = tomllib.loads(cli("codex-config", "--state-dir", str(tmp_path / "state"), "--chatgpt",
                                "--no-mcp").stdout)
    provider = chatgpt["model_providers"]["ctproxy"]
    assert provider["base_url"] == "http://127.0.0.1:8787/backend-api/codex"
    assert provider["requires_openai_auth"] is True and "env_key" not in provider
    assert "mcp_servers" not in chatgpt

    bad = cli("codex-config", "--state-dir", str(tmp_path / "state"), "--agent", "root")
    assert bad.returncode == 2 and "--agent" in bad.stderr


def test_the_per_client_web_search_switch(tmp_path):
    """Issue 31 / defect 2: `--web-search off` puts `x-ctp-web-search: off` on Codex's model requests only."""
    data = tomllib.loads(cli("codex-config", "--state-dir", str(tmp_path / "state"), "--task", "task_given",
                             "--web-search", "off").stdout)
    assert data["model_providers"]["ctproxy"]["http_headers"]["x-ctp-web-search"] == "off"
    assert "x-ctp-web-search" not in data["mcp_servers"]["ctproxy"]["http_headers"]
    plain = tomllib.loads(cli("codex-config", "--state-dir", str(tmp_path / "state"), "--task", "task_given").stdout)
    assert "x-ctp-web-search" not in plain["model_providers"]["ctproxy"]["http_headers"]
    assert cli("codex-config", "--state-dir", str(tmp_path / "state"), "--web-search", "maybe").returncode == 2


def test_remote_compaction_v2_capability(tmp_path):
    """Issue 44 (2): Codex 0.171 reads `[model_providers.ctproxy.capabilities] remote_compaction`. With no
    running ctproxy (the default upstream is the official one) it is v2; `--remote-compaction` chooses."""
    state = str(tmp_path / "state")
    data = tomllib.loads(cli("codex-config", "--state-dir", state, "--task", "task_given").stdout)
    assert data["model_providers"]["ctproxy"]["capabilities"] == {"remote_compaction": "v2"}
    local = tomllib.loads(cli("codex-config", "--state-dir", state, "--task", "task_given",
                              "--remote-compaction", "unsupported").stdout)
    assert local["model_providers"]["ctproxy"]["capabilities"] == {"remote_compaction": "unsupported"}
    # merged into a file, read back whole
    path = tmp_path / "config.toml"
    path.write_text(EXISTING)
    assert cli("codex-config", "--state-dir", state, "--task", "task_given", "--write", str(path)).returncode == 0
    assert tomllib.loads(path.read_text())["model_providers"]["ctproxy"]["capabilities"] == {
        "remote_compaction": "v2"}


async def test_remote_compaction_is_local_for_an_upstream_that_cannot_compact(proxy_factory):
    """A running ctproxy whose upstream is neither official nor trusted: Codex would send its v2 compaction
    there and fail on the missing `compaction` item, so codex-config says `unsupported`, and why."""
    proxy = await proxy_factory(upstream="http://127.0.0.1:9", trust_upstream=False)
    out = await asyncio.to_thread(cli, "codex-config", "--state-dir", str(proxy.state_dir))
    assert out.returncode == 0, out.stderr
    assert tomllib.loads(out.stdout)["model_providers"]["ctproxy"]["capabilities"] == {
        "remote_compaction": "unsupported"}
    assert "compacts locally" in out.stderr


EXISTING = """\
# my Codex settings
model = "gpt-5"
model_provider = "openai"
approval_policy = "on-request"

[model_providers.other]
name = "other"
base_url = "http://other.example/v1"

[model_providers.ctproxy]
name = "from the README, by hand"
base_url = "http://127.0.0.1:9999/v1"

# the fast profile
[profiles.fast]
model = "gpt-5-mini"

[mcp_servers.docs]
url = "https://docs.example/mcp"
"""


def test_write_merges_into_an_existing_config(tmp_path):
    path = tmp_path / "codex" / "config.toml"
    path.parent.mkdir()
    path.write_text(EXISTING)
    path.chmod(0o640)
    state = str(tmp_path / "state")
    out = cli("codex-config", "--state-dir", state, "--write", str(path), "--task", "task_one")
    assert out.returncode == 0, out.stderr
    assert str(path) in out.stdout
    text = path.read_text()
    data = tomllib.loads(text)
    before = tomllib.loads(EXISTING)
    assert data["model_provider"] == "ctproxy"
    assert data["model_providers"]["other"] == before["model_providers"]["other"]
    assert data["model_providers"]["ctproxy"]["base_url"] == "http://127.0.0.1:8787/v1"
    assert data["model_providers"]["ctproxy"]["name"] == "ctproxy"  # replaced whole
    assert data["profiles"] == before["profiles"] and data["mcp_servers"]["docs"] == before["mcp_servers"]["docs"]
    assert data["approval_policy"] == "on-request" and data["model"] == "gpt-5"
    assert data["mcp_servers"]["ctproxy"]["http_headers"]["x-ctp-task"] == "task_one"
    assert "# my Codex settings" in text and "# the fast profile\n[profiles.fast]" in text
    assert "from the README" not in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # the user's mode is kept

    # Again, with another task: the ctproxy tables are replaced, nothing is duplicated.
    again = cli("codex-config", "--state-dir", state, "--write", str(path), "--task", "task_two")
    assert again.returncode == 0, again.stderr
    text2 = path.read_text()
    assert text2 == text.replace("task_one", "task_two")
    assert text2.count("[model_providers.ctproxy]") == 1 and text2.count("model_provider =") == 1

    # A new file is created private: it holds the tool server's token.
    fresh = tmp_path / "new" / "config.toml"
    assert cli("codex-config", "--state-dir", state, "--write", str(fresh), "--task", "t").returncode == 0
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600
    assert tomllib.loads(fresh.read_text())["model_provider"] == "ctproxy"


@pytest.mark.parametrize("content", [
    'model_providers = { ctproxy = { name = "inline" } }\n',  # ctproxy settings outside its own table
    "model = \n",  # not TOML
])
def test_write_leaves_a_file_it_cannot_merge_unchanged(tmp_path, content):
    path = tmp_path / "config.toml"
    path.write_text(content)
    out = cli("codex-config", "--state-dir", str(tmp_path / "state"), "--write", str(path), "--task", "t")
    assert out.returncode == 1
    assert "unchanged" in out.stderr and "by hand" in out.stderr
    assert path.read_text() == content


# What a test needs on top of codex-config's entries: nothing that phones home, no retries.
TEST_SETTINGS = """\
model = "gpt-5"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


async def test_codex_runs_with_the_written_config_and_calls_a_tool_over_mcp(emulator: Emulator, proxy_factory,
                                                                            tmp_path):
    proxy = await proxy_factory(upstream=emulator.url)
    codex_home, home, work = tmp_path / "codex-home", tmp_path / "home", tmp_path / "work"
    for d in (codex_home, home, work):
        d.mkdir()
    config = codex_home / "config.toml"
    config.write_text(TEST_SETTINGS)
    out = await asyncio.to_thread(cli, "codex-config", "--state-dir", str(proxy.state_dir), "--write", str(config))
    assert out.returncode == 0, out.stderr
    task = tomllib.loads(config.read_text())["model_providers"]["ctproxy"]["http_headers"]["x-ctp-task"]

    # The model asks for a ctproxy tool that writes (Codex lists MCP tools in the `mcp__<server>` namespace).
    emulator.script(FunctionCall("notes_write_file", {"path": "plan.md", "text": "written by codex over mcp"},
                                 namespace="mcp__ctproxy", call_id="call_note"))
    emulator.set_default(Text("noted", deltas=2))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(codex_home),
           "OPENAI_API_KEY": "sk-codex-test-not-real", "NO_COLOR": "1", "LANG": "C.UTF-8"}
    proc = await asyncio.create_subprocess_exec(
        str(codex_binary()), "exec", "--skip-git-repo-check", "--json", "write the plan", cwd=work, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 180)
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        pytest.fail(f"codex exec did not finish; stderr tail:\n{stderr.decode()[-2000:]}")
    events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    assert proc.returncode == 0, f"{stderr.decode()[-3000:]}\n{stdout.decode()[-3000:]}"
    calls = [e["item"] for e in events if e.get("type") == "item.completed"
             and e.get("item", {}).get("type") == "mcp_tool_call"]
    assert len(calls) == 1, events
    assert calls[0]["server"] == "ctproxy" and calls[0]["tool"] == "notes_write_file"
    assert calls[0]["status"] == "completed" and not calls[0].get("error"), calls[0]

    # The tool ran in the task and agent of the config: the note is there for that identity only.
    token = (proxy.state_dir / "token").read_text().strip()
    async with aiohttp.ClientSession() as http:
        async with http.post(proxy.tools_url + "/v1/tools/notes_read_file", json={"path": "plan.md"},
                             headers={"Authorization": f"Bearer {token}", "x-ctp-task": task,
                                      "x-ctp-agent": "/root"}) as resp:
            body = await resp.json()
        assert resp.status == 200 and "written by codex over mcp" in body["text"], body
        async with http.post(proxy.tools_url + "/v1/tools/notes_read_file", json={"path": "plan.md"},
                             headers={"Authorization": f"Bearer {token}", "x-ctp-task": task,
                                      "x-ctp-agent": "/root/someone-else"}) as resp:
            other = await resp.json()
        assert "written by codex over mcp" not in json.dumps(other), other
    # And the model's turns went through the proxy under the same task.
    assert f"task {task}" in _known_tasks(proxy.state_dir) and "/root" in _known_tasks(proxy.state_dir)
    assert len(emulator.responses_requests) == 2
    assert not [k for r in emulator.responses_requests for k, _ in r.headers if k.lower().startswith("x-ctp-")]


async def test_codex_backend_calls_through_the_proxy_keep_the_configured_identity(emulator: Emulator,
                                                                                  proxy_factory, tmp_path):
    """Seed 000 defect 2: a Codex set up by `ctproxy codex-config` sends its `x-ctp-task` / `x-ctp-agent`
    headers (model_providers.ctproxy.http_headers) on every request to its base URL, the history/notes
    backend calls of Codex builds with that extension included. Codex CLI itself runs a turn, then the
    backend call is made to the same base URL with those headers and Codex's session id: it runs in the
    configured task, and history reads Codex's turn."""
    proxy = await proxy_factory(upstream=emulator.url)
    codex_home, home, work = tmp_path / "codex-home", tmp_path / "home", tmp_path / "work"
    for d in (codex_home, home, work):
        d.mkdir()
    config = codex_home / "config.toml"
    config.write_text(TEST_SETTINGS)
    out = await asyncio.to_thread(cli, "codex-config", "--state-dir", str(proxy.state_dir), "--write", str(config))
    assert out.returncode == 0, out.stderr
    provider = tomllib.loads(config.read_text())["model_providers"]["ctproxy"]
    headers = dict(provider["http_headers"])
    emulator.set_default(Text("the marker is okapi-5512", deltas=2))
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(codex_home),
           "OPENAI_API_KEY": "sk-codex-test-not-real", "NO_COLOR": "1", "LANG": "C.UTF-8"}
    proc = await asyncio.create_subprocess_exec(
        str(codex_binary()), "exec", "--skip-git-repo-check", "--json", "say the marker", cwd=work, env=env,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 180)
    except TimeoutError:
        proc.kill()
        stdout, stderr = await proc.communicate()
        pytest.fail(f"codex exec did not finish; stderr tail:\n{stderr.decode()[-2000:]}")
    assert proc.returncode == 0, stderr.decode()[-3000:]
    events = [json.loads(line) for line in stdout.decode().splitlines() if line.startswith("{")]
    session_id = next(e["thread_id"] for e in events if e.get("type") == "thread.started")

    base = provider["base_url"].rstrip("/")
    body = {"query": "okapi-5512", "context": {"session_id": session_id, "current_agent_name": "/root"}}
    found: dict = {}
    async with aiohttp.ClientSession() as http:
        for _ in range(200):  # the journal writes Codex's answer on its own thread: wait for it
            async with http.post(f"{base}/alpha/history/v2/search_contents", json=body,
                                 headers={"Authorization": "Bearer sk-codex-test-not-real", **headers}) as resp:
                found = await resp.json(content_type=None)
            if resp.status == 200 and found.get("ok") and "okapi-5512" in found.get("output", ""):
                break
            assert found.get("error") != "unknown_task", found
            await asyncio.sleep(0.05)
    assert found.get("ok") and "okapi-5512" in found["output"], found
    # the backend call never went upstream: the emulator saw Codex's Responses request only
    assert [r.route for r in emulator.requests] == ["responses"]
