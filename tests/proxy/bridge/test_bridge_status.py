"""`ctproxy status` on the bridge: bridged / not bridged and why, true of the running proxy (issue 12)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from proxy.app.status import bridge_report, render
from proxy.config import Config
from proxy.state import StateDir
from tests.support.proxyproc import REPO


def test_report_says_why_a_family_is_not_bridged(tmp_path):
    config = Config.model_validate({"bridge": {"families": ["context", "shell", "notes"]},
                                    "notes": {"enabled": False}})
    by = {s.family: s for s in bridge_report(config, None)}
    assert by["context"].bridged and "get_context_remaining" in by["context"].tools
    assert not by["notes"].bridged and "notes.enabled is false" in by["notes"].reason
    assert not by["shell"].bridged and "shell is off" in by["shell"].reason
    assert not by["history"].bridged and "not in bridge.families" in by["history"].reason
    text = render(config, StateDir.open(tmp_path / "s"), tmp_path / "s" / "config.json")
    assert "bridge:    up to 8 rounds" in text
    assert any(line.split()[:2] == ["context", "bridged"] for line in text.splitlines())


def test_off_by_default(tmp_path):
    text = render(Config(), StateDir.open(tmp_path / "s"), tmp_path / "s" / "config.json")
    assert "bridge:    off" in text


async def test_status_of_the_running_proxy(emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context,history"])
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy.app.cli", "status", "--state-dir",
                                                   str(proxy.state_dir), "--json"],
                                  capture_output=True, text=True, cwd=REPO, timeout=60)
    data = json.loads(out.stdout)
    by = {b["family"]: b for b in data["bridge"]}
    assert by["context"]["bridged"] and by["history"]["bridged"]
    assert not by["notes"]["bridged"] and "not in bridge.families" in by["notes"]["reason"]


async def test_status_names_tools_an_agent_displaced(emulator, proxy_factory):
    import openai

    proxy = await proxy_factory(upstream=emulator.url, extra_args=["--bridge", "context"])
    mine = {"type": "function", "name": "get_context_remaining", "parameters": {"type": "object", "properties": {}}}
    c = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-x", max_retries=0)
    await c.responses.create(model="gpt-4.1", input="hi", tools=[mine])
    sent = emulator.responses_requests[0].json["tools"]
    assert [t.get("name") for t in sent].count("get_context_remaining") == 1  # the agent's, not ours
    reason = ""
    for _ in range(100):  # written within a second or so
        out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy.app.cli", "status", "--state-dir",
                                                       str(proxy.state_dir), "--json"],
                                      capture_output=True, text=True, cwd=REPO, timeout=60)
        reason = next(b["reason"] for b in json.loads(out.stdout)["bridge"] if b["family"] == "context")
        if "displaced" in reason:
            break
        await asyncio.sleep(0.2)
    assert "displaced by an agent tool of the same name: get_context_remaining (1 request)" in reason
