"""`ctproxy status` on the bridge: bridged / not bridged and why, true of the running proxy (issue 12)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

from proxy.config import Config
from proxy.state import StateDir
from proxy.status import bridge_report, render
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
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy.cli", "status", "--state-dir",
                                                   str(proxy.state_dir), "--json"],
                                  capture_output=True, text=True, cwd=REPO, timeout=60)
    data = json.loads(out.stdout)
    by = {b["family"]: b for b in data["bridge"]}
    assert by["context"]["bridged"] and by["history"]["bridged"]
    assert not by["notes"]["bridged"] and "not in bridge.families" in by["notes"]["reason"]
