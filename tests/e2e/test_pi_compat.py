"""Pi 1.6 (issue 44 (3)): `ctproxy pi-config`'s entry is accepted by the real Pi 1.6, and the compat flags it
sets are the ones whose shapes ctproxy passes through: `prompt_cache_options` (supportsExplicitPromptCacheMode)
and the long cache retention reach the upstream as Pi sent them; `additional_tools` items
(supportsAdditionalTools; Pi sends them for tools added mid-conversation, not exercised here) are read and kept
(tests/proxy/windows/test_session_tools.py, tests/e2e/test_codex_additional_tools.py).

The emulator here does not validate requests: its OpenAPI check still refuses Pi's function tools without
`strict` (issue 44's emulator gaps, fixed elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.emulator import Emulator
from tests.support.pi import pi_binary, pi_env, run_pi

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180.0


def cli(state: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "proxy.app.cli", *args, "--state-dir", str(state)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_compat_flags_pi_config_writes(tmp_path):
    out = json.loads(cli(tmp_path / "state", "pi-config", "--task", "task_given", "--model", "gpt-5",
                         "--model", "gpt-6.2-astra", "--model", "gpt-6-cyber"))
    provider = out["providers"]["ctproxy"]
    assert provider["compat"] == {"supportsLongCacheRetention": True}
    by = {m["id"]: m for m in provider["models"]}
    assert "compat" not in by["gpt-5"]  # older models reject prompt_cache_options (Pi's own catalog agrees)
    assert by["gpt-6.2-astra"]["compat"] == {"supportsExplicitPromptCacheMode": True, "supportsAdditionalTools": True}
    assert by["gpt-6-cyber"]["compat"] == {"supportsExplicitPromptCacheMode": True}


async def test_pi_16_sends_its_cache_shapes_through_ctproxy_unchanged(proxy_factory, tmp_path):
    """Pi 1.6 with long cache retention (`PI_CACHE_RETENTION=long`) and pi-config's flags: for GPT-6.2 Astra
    it sends `prompt_cache_options: {ttl: "30m"}` (supportsExplicitPromptCacheMode + supportsLongCacheRetention),
    for GPT-5 `prompt_cache_retention: "24h"` (supportsLongCacheRetention alone); both reach the upstream as
    sent. Without the flags Pi sends neither to a provider on a loopback URL."""
    pi = pi_binary()
    async with Emulator() as emulator:
        proxy = await proxy_factory(upstream=emulator.url)
        agent_dir, home, work = tmp_path / "pi-agent", tmp_path / "home", tmp_path / "work"
        for d in (agent_dir, home, work):
            d.mkdir()
        cli(proxy.state_dir, "pi-config", "--write", str(agent_dir / "models.json"), "--model", "gpt-6.2-astra",
            "--model", "gpt-5")
        env = pi_env(home, agent_dir, PI_CACHE_RETENTION="long")
        for model in ("gpt-6.2-astra", "gpt-5"):
            code, out, err = await run_pi(pi, ["-p", "fix the build", "--provider", "ctproxy", "--model", model,
                                               "--no-session"], work, env, TIMEOUT)
            assert code == 0, err.decode()[-3000:]
            assert "You said: fix the build" in out.decode()
        new, old = emulator.responses_requests
        assert new.json["model"] == "gpt-6.2-astra" and new.json.get("prompt_cache_key")
        assert new.json.get("prompt_cache_options") == {"ttl": "30m"}, new.json.keys()
        assert "prompt_cache_retention" not in new.json
        assert old.json["model"] == "gpt-5" and old.json.get("prompt_cache_retention") == "24h", old.json.keys()
        assert "prompt_cache_options" not in old.json
