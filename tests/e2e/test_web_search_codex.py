"""Codex CLI 0.169 and web search through ctproxy (issue 31), against the validating emulator.

- Defect 2: a Codex that turned its own web search off (`web_search = "disabled"`) and whose config
  `ctproxy codex-config --web-search off` wrote gets no hosted search injected either.
- Defect 3: Codex lists an MCP server's tools in a `namespace` tool (`mcp__ctproxy`). When that server offers
  the sidecar `openai_web_search` (here a tool server on its own, which knows no upstream), the turn has its
  search path: the proxy adds no native search beside it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from proxy.app.codexconfig import CODEX_NAME, codex_entries, render_codex_tables
from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available
from tests.proxy.app.test_cli_codex_config import TEST_SETTINGS, cli
from tests.support.codex import codex_env, isolated_dirs, run_codex
from tests.support.proxyproc import ProxyProcess

pytestmark = pytest.mark.timeout(300)
SOURCES = "web_search_call.action.sources"


def hosted_search(body: dict) -> list:
    return [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "web_search"]


async def codex_turn(tmp: Path, config: str, emulator: Emulator) -> dict:
    home, codex_home, work = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(config)
    env = codex_env(home, codex_home, OPENAI_API_KEY="sk-codex-test-not-real")
    code, _, err = await run_codex(["exec", "--skip-git-repo-check", "say hi"], work, env, 180)
    assert code == 0, err.decode()[-3000:]
    [turn] = emulator.responses_requests
    assert turn.status == 200
    return turn.json


async def test_codex_config_web_search_off_and_codex_search_disabled_get_no_injection(tmp_path):
    async with Emulator(validate_requests=spec_available()) as emulator:
        emulator.set_default(Text("hi", deltas=2))
        proxy = await ProxyProcess(tmp_path / "state", upstream=emulator.url).astart()
        try:
            config = tmp_path / "codex.toml"
            config.write_text('web_search = "disabled"\n' + TEST_SETTINGS)
            out = await asyncio.to_thread(cli, "codex-config", "--state-dir", str(proxy.state_dir), "--no-mcp",
                                          "--web-search", "off", "--write", str(config))
            assert out.returncode == 0, out.stderr
            body = await codex_turn(tmp_path, config.read_text(), emulator)
        finally:
            await proxy.astop()
    assert hosted_search(body) == [] and SOURCES not in (body.get("include") or [])


async def test_the_sidecar_in_codexs_mcp_namespace_is_the_turns_search_path(tmp_path):
    async with Emulator(validate_requests=spec_available()) as emulator:
        emulator.set_default(Text("hi", deltas=2))
        cfg = tmp_path / "config.json"
        cfg.write_text(json.dumps({"web_search": {"enabled": True, "sidecar_model": "gpt-5-mini"}}))
        # The MCP server: the tool server of another ctproxy, whose upstream is not eligible (untrusted), so it
        # lists the sidecar; the model requests go through a proxy in front of the (trusted) emulator.
        # Behind an untrusted upstream the sidecar can only use OPENAI_API_KEY (else it is unavailable, issue 27).
        other = await ProxyProcess(tmp_path / "tools-state", upstream="http://127.0.0.1:9", trust_upstream=False,
                                   extra_args=["--config", str(cfg)],
                                   env={"OPENAI_API_KEY": "sk-env-not-real"}).astart()
        proxy = await ProxyProcess(tmp_path / "state", upstream=emulator.url, with_tools=False,
                                   extra_args=["--config", str(cfg)]).astart()
        tools_url = other.tools_url
        try:
            token = (tmp_path / "tools-state" / "token").read_text().strip()
            entries = codex_entries(proxy=proxy.url, tools=tools_url, token=token, token_env=None,
                                    task="task_none", agent="/root", env_key="OPENAI_API_KEY", chatgpt=False)
            provider = entries["model_providers"][CODEX_NAME]  # type: ignore[index]
            provider["http_headers"] = {}  # no task in the proxy's state: a key-less Codex
            entries["mcp_servers"][CODEX_NAME]["http_headers"] = {"Authorization": f"Bearer {token}"}  # type: ignore[index]
            config = "\n".join(['web_search = "disabled"', f'model_provider = "{CODEX_NAME}"', TEST_SETTINGS,
                                *render_codex_tables(entries)])
            body = await codex_turn(tmp_path, config, emulator)
        finally:
            await proxy.astop()
            await other.astop()
    spaces = [t for t in body.get("tools") or [] if t.get("type") == "namespace" and t.get("name") == "mcp__ctproxy"]
    assert spaces and "openai_web_search" in [m.get("name") for m in spaces[0].get("tools") or []], body["tools"]
    assert hosted_search(body) == []  # one Toolkit search path per turn
