"""Codex CLI 0.169 (`codex exec`) through `ctproxy up --bridge notes` against the validating emulator (issue 12):
the scripted model calls the bridged `notes_write_file` (run by ctproxy), then Codex's own shell tool (run by
Codex), then answers. Codex completes, the note is written, and every request the emulator received is valid
under the official OpenAPI description and the real API's input rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.test_codex_cli import TIMEOUT, config_toml, ctproxy_cli
from tests.emulator import Emulator, FunctionCall, Text
from tests.openapi_schema import spec_available
from tests.support.codex import codex_env, isolated_dirs, run_codex
from tests.support.proxyproc import ProxyProcess

pytestmark = pytest.mark.timeout(300)
ANSWER = "Noted, and the shell said hi."


async def codex_exec(tmp: Path, base_url: str, task: str, prompt: str) -> tuple[int, str, str]:
    home, codex_home, work = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(config_toml(base_url, task))
    env = codex_env(home, codex_home, CTPROXY_TEST_KEY="sk-codex-test-not-real")
    code, out, err = await run_codex(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                                      prompt], work, env, TIMEOUT)
    return code, out.decode(errors="replace"), err.decode(errors="replace")


async def test_codex_exec_with_a_bridged_call_and_its_own_shell(tmp_path: Path) -> None:
    async with Emulator(validate_requests=spec_available()) as emulator:
        proxy = await ProxyProcess(tmp_path / "state", upstream=emulator.url,
                                   extra_args=["--bridge", "notes,context"]).astart()
        try:
            emulator.script(
                FunctionCall("notes_write_file", {"path": "plan.md", "text": "step 1: say hi\n"}, call_id="c_note"),
                FunctionCall("exec_command", {"cmd": "echo hi-from-codex-shell"}, call_id="c_shell"),
                Text(ANSWER, deltas=3))
            task = ctproxy_cli(proxy.state_dir, "task", "new").strip()
            code, out, err = await codex_exec(tmp_path, proxy.url + "/v1", task, "plan, then say hi")
            assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
            assert ANSWER in out
            turns = emulator.responses_requests
            assert len(turns) == 3, [r.status for r in turns]
            assert all(r.status == 200 for r in turns), [(r.status, r.path) for r in turns]
            first, second, third = (r.json for r in turns)
            names = [t.get("name") or t.get("type") for t in first["tools"]]
            assert "notes_write_file" in names and "exec_command" in names
            # ctproxy ran the note and continued the turn (round 2); Codex ran its shell (request 3)
            assert any(i.get("type") == "function_call_output" and i.get("call_id") == "c_note"
                       for i in second["input"])
            shell_out = [i for i in third["input"] if i.get("type") == "function_call_output"
                         and i.get("call_id") == "c_shell"]
            assert shell_out and "hi-from-codex-shell" in str(shell_out[0]["output"])
            assert not [i for i in third["input"] if i.get("type") == "mcp_call"]  # never sent upstream
            notes = list((proxy.state_dir / "notes").rglob("plan.md"))
            assert notes and notes[0].read_text() == "step 1: say hi\n"
        finally:
            await proxy.astop()
