"""Codex CLI 0.169's Responses-lite requests through ctproxy (issue 31). For a model whose catalog entry says
`use_responses_lite` (here `gpt-6-sol`), Codex sends its tools in a leading input item
`{"type": "additional_tools", "role": "developer", "tools": [...]}` with the header
`x-openai-internal-codex-responses-lite`. ctproxy must pass the item on unchanged (compared with what the same
Codex sends to the emulator directly) and count its tools as the agent's: a bridged tool of the same name as
one of Codex's (code mode's `exec` and `wait`) is left out. The emulator validates every request."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_codex_cli import config_toml
from tests.emulator import Emulator, Text
from tests.openapi_schema import spec_available
from tests.support.codex import codex_env, isolated_dirs, run_codex
from tests.support.proxyproc import ProxyProcess

pytestmark = pytest.mark.timeout(300)
LITE_MODEL = "gpt-6-sol"
LITE_HEADER = "x-openai-internal-codex-responses-lite"


def lite_config(base_url: str) -> str:
    cfg = config_toml(base_url, "unused").replace('model = "gpt-5"', f'model = "{LITE_MODEL}"')
    return "\n".join(line for line in cfg.splitlines() if not line.startswith("http_headers"))


async def codex_turn(tmp: Path, base_url: str, emulator: Emulator) -> dict:
    home, codex_home, work = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(lite_config(base_url))
    env = codex_env(home, codex_home, CTPROXY_TEST_KEY="sk-codex-test-not-real")
    code, _, err = await run_codex(["exec", "--skip-git-repo-check", "say hi"], work, env, 180)
    assert code == 0, err.decode()[-3000:]
    turn = emulator.responses_requests[-1]
    assert turn.status == 200 and LITE_HEADER in {k.lower() for k, _ in turn.headers}
    return turn.json


def names(tools: list) -> list[str]:
    out = []
    for t in tools:
        out.append(t.get("name") or t.get("type"))
        if t.get("type") == "namespace":
            out += [m.get("name") for m in t.get("tools") or []]
    return out


async def test_additional_tools_pass_unchanged_and_their_tools_are_the_agents(tmp_path):
    async with Emulator(validate_requests=spec_available()) as emulator:
        emulator.set_default(Text("hi", deltas=2))
        direct = await codex_turn(tmp_path / "direct", emulator.url + "/v1", emulator)
        work = tmp_path / "ws"
        work.mkdir()
        proxy = await ProxyProcess(tmp_path / "state", upstream=emulator.url,
                                   extra_args=["--bridge", "code_mode,notes", "--enable", "code_mode",
                                               "--workspace", str(work)]).astart()
        try:
            via = await codex_turn(tmp_path / "via", proxy.url + "/v1", emulator)
        finally:
            await proxy.astop()
    lead = direct["input"][0]
    assert lead["type"] == "additional_tools" and {"exec", "wait"} <= set(names(lead["tools"]))
    # the item reaches the upstream unchanged, still leading (only its id is new in each Codex run)
    assert {k: v for k, v in via["input"][0].items() if k != "id"} == {k: v for k, v in lead.items() if k != "id"}
    assert str(via["input"][0].get("id", "at_")).startswith("at_")
    top = names(via.get("tools") or [])
    assert "notes_write_file" in top  # bridged: Codex has no tool of that name
    assert "exec" not in top and "wait" not in top  # Codex's own code mode, in additional_tools, wins
