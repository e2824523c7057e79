"""Codex CLI with its BUILT-IN provider (no `openai_base_url`) in front of the official-route double, ctproxy as
its HTTPS proxy (`--mode regular`) with ctproxy's CA (issue 43): with an API key Codex goes to api.openai.com.
Codex runs inside the double's namespaces (`official.command`). Skips without root or without Codex installed.

Not here yet: the ChatGPT sign-in. Codex 0.171 signed in asks chatgpt.com for more than the Responses route
before its first turn (GET /backend-api/codex/models, POST /backend-api/ps/mcp, a "workspace routing
discovery"), which the emulator does not serve (docs/official-route.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.emulator import Text
from tests.support.codex import codex_binary, codex_env, isolated_dirs
from tests.support.official import official  # noqa: F401  (the fixture)

pytestmark = pytest.mark.timeout(300)
ANSWER = "Hello from the official double."
CONFIG = """\
model = "gpt-5"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


async def _codex(official, tmp: Path, proxy, env_extra: dict[str, str]) -> tuple[int, str, str]:  # noqa: F811
    home, codex_home, workdir = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(CONFIG)
    ca = proxy.state_dir / "mitmproxy" / "mitmproxy-ca-cert.pem"
    env = codex_env(home, codex_home, HTTPS_PROXY=proxy.url, https_proxy=proxy.url, NO_PROXY="", no_proxy="",
                    CODEX_CA_CERTIFICATE=str(ca), **env_extra)
    argv = official.command([str(codex_binary()), "exec", "--skip-git-repo-check", "say hi"], cwd=workdir,
                            set_env=env)
    proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 200)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")


async def test_codex_builtin_provider_with_an_api_key_through_ctproxy_as_https_proxy(official, tmp_path):  # noqa: F811
    codex_binary()
    emu = official.emulator
    emu.set_default(Text(ANSWER, deltas=5))
    proxy = await official.proxy(mode="regular", with_tools=False)
    code, out, err = await _codex(official, tmp_path, proxy, {"CODEX_API_KEY": "sk-codex-official-not-real"})
    turns = [r for r in emu.requests if r.route == "responses"]
    seen = [(r.method, r.header("host"), r.path, r.transport, r.status) for r in emu.requests]
    assert code == 0, f"codex failed ({code}):\n{err[-3000:]}\nemulator saw {seen}\nproxy:\n{proxy.log()[-2000:]}"
    assert ANSWER in out
    assert turns and all(((r.header("host") or "").split(":")[0], r.path) == ("api.openai.com", "/v1/responses")
                         for r in turns), seen
    assert all(r.header("authorization") == "Bearer sk-codex-official-not-real" for r in turns), seen
    # Each create went through ctproxy's chain (its request log names it) and up over its own socket or HTTP.
    assert "ctproxy-request" in proxy.log() and "sk-codex-official-not-real" not in proxy.log()
