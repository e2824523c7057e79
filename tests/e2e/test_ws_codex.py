"""Codex CLI 0.169 with its built-in OpenAI provider pointed at ctproxy (`openai_base_url`): it opens the
Responses WebSocket first (issue 28). Through ctproxy every create runs through the chain and goes upstream
over ctproxy's own socket to the emulator: no fallback to HTTP, the journal holds the session, a bridged call
runs inside a WebSocket turn, and every create the emulator received was valid."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from tests.emulator import Emulator, FunctionCall, Text
from tests.openapi_schema import spec_available
from tests.support.codex import codex_env, isolated_dirs, run_codex

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
ANSWER = "Hello over the socket, relayed by ctproxy."


def config_toml(base_url: str) -> str:
    return f"""\
model = "gpt-5"
openai_base_url = "{base_url}"
check_for_update_on_startup = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
"""


async def codex_exec(tmp: Path, base_url: str, prompt: str) -> tuple[int, str, str]:
    home, codex_home, workdir = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(config_toml(base_url))
    env = codex_env(home, codex_home, CODEX_API_KEY="sk-codex-ws-test-not-real")
    code, out, err = await run_codex(["exec", "--skip-git-repo-check", prompt], workdir, env, 180.0)
    return code, out.decode(errors="replace"), err.decode(errors="replace")


def tasks_json(state_dir: Path) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "proxy.app.cli", "tasks", "--state-dir", str(state_dir), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


async def journaled(state_dir: Path, at_least: int) -> list[dict]:
    sessions: list[dict] = []
    for _ in range(100):
        tasks = await asyncio.to_thread(tasks_json, state_dir)
        sessions = [s for t in tasks for a in t["agents"] for s in a["sessions"]]
        if sum(s["items"] for s in sessions) >= at_least:
            break
        await asyncio.sleep(0.2)
    return sessions


async def test_codex_builtin_provider_runs_its_websocket_turns_through_the_chain(proxy_factory, tmp_path) -> None:
    async with Emulator(validate_requests=spec_available()) as emu:
        emu.set_default(Text(ANSWER, deltas=5))
        proxy = await proxy_factory(upstream=emu.url)
        code, out, err = await codex_exec(tmp_path, proxy.url + "/v1", "say hi")
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        assert turns and all(r.transport == "ws" for r in turns), [(r.method, r.path, r.transport) for r in turns]
        assert all(r.status == 200 for r in turns), [r.extra.get("error_body") for r in turns]
        assert not [r for r in emu.requests if r.method == "POST" and r.path.endswith("/responses")], \
            "Codex fell back to HTTP"
        upgrade = {k.lower(): v for k, v in emu.ws_upgrades[0]}
        assert upgrade["openai-beta"].startswith("responses_websockets=")
        assert upgrade["authorization"] == "Bearer sk-codex-ws-test-not-real"
        real = [r for r in turns if r.json.get("generate") is not False]
        sessions = await journaled(proxy.state_dir, len(real[-1].json["input"]) + 1)
        assert len(sessions) == 1 and sessions[0]["items"] >= len(real[-1].json["input"]) + 1, sessions
        lines = [ln for ln in proxy.log().splitlines() if "ctproxy-request POST /v1/responses" in ln]
        assert len(lines) == len(turns) and all("transport=ws" in ln for ln in lines), lines


async def test_codex_gets_a_bridged_call_inside_a_websocket_turn(proxy_factory, tmp_path) -> None:
    async with Emulator(validate_requests=spec_available()) as emu:
        emu.script(FunctionCall("get_context_remaining", {}, call_id="call_ws_ctx"))
        emu.set_default(Text(ANSWER, deltas=5))
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context"])
        code, out, err = await codex_exec(tmp_path, proxy.url + "/v1", "how much context is left?")
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        assert all(r.transport == "ws" for r in turns) and all(r.status == 200 for r in turns), \
            [(r.transport, r.status, r.extra.get("error_body")) for r in turns]
        assert len({r.ws_connection for r in turns}) == 1, "the bridged round went over the same socket"
        rounds = [r for r in turns if r.json.get("generate") is not False]
        assert len(rounds) == 2, [r.json.get("input", [])[-1:] for r in rounds]
        outputs = [i for i in rounds[1].json["input"] if i.get("type") == "function_call_output"]
        assert outputs and outputs[-1]["call_id"] == "call_ws_ctx"
        assert any(t.get("name") == "get_context_remaining" for t in rounds[0].json.get("tools") or [])


async def codex_exec_json(tmp: Path, base_url: str, prompt: str, extra_toml: str = "") -> tuple[int, str, str]:
    """`codex exec` with the built-in provider at `base_url`, no sandbox (Codex's own shell runs), a fresh HOME."""
    home, codex_home, workdir = isolated_dirs(tmp)
    (codex_home / "config.toml").write_text(extra_toml + config_toml(base_url))
    env = codex_env(home, codex_home, CODEX_API_KEY="sk-codex-ws-test-not-real")
    code, out, err = await run_codex(["exec", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox",
                                      prompt], workdir, env, 180.0)
    return code, out.decode(errors="replace"), err.decode(errors="replace")


async def test_codex_new_context_rollover_across_websocket_turns(proxy_factory, tmp_path) -> None:
    """Codex over the socket, `--bridge context,notes`: the model calls the bridged `new_context` (ctproxy runs
    it and rolls the session over), then Codex's own shell; every round after the rollover — the bridge's next
    round and Codex's next create with the shell's output, on the same connection — goes up in the new window."""
    from tests.e2e.test_context_codex import assert_new_window

    prompt = "Please do the long task with a rollover in the middle of it."
    async with Emulator(validate_requests=spec_available()) as emu:
        emu.script(FunctionCall("new_context", {}, call_id="call_nc"),
                   FunctionCall("exec_command", {"cmd": "ls | wc -l"}, call_id="call_sh"), Text(ANSWER, deltas=3))
        proxy = await proxy_factory(upstream=emu.url, extra_args=["--bridge", "context,notes"])
        code, out, err = await codex_exec_json(tmp_path, proxy.url + "/v1", prompt)
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        assert turns and all(r.transport == "ws" and r.status == 200 for r in turns), \
            [(r.transport, r.status, r.extra.get("error_body")) for r in turns]
        assert len({r.ws_connection for r in turns}) == 1, "one connection, no fallback to HTTP"
        real = [r for r in turns if r.json.get("generate") is not False]
        assert len(real) == 3, [(r.json.get("previous_response_id"), len(r.json.get("input") or [])) for r in real]
        first, round2, nxt = real
        assert "new_context" in {t.get("name") for t in first.json.get("tools") or []}
        assert prompt in orjson.dumps(first.json["input"]).decode()
        assert_new_window(round2.json["input"])  # the bridge's next round, over the socket
        outputs = [i for i in nxt.json["input"] if i.get("type") == "function_call_output"]
        assert outputs and outputs[-1]["call_id"] == "call_sh"
        assert prompt not in orjson.dumps(nxt.json["input"]).decode(), "Codex's next create is in the new window"


async def test_codex_remote_compaction_over_the_socket(proxy_factory, tmp_path) -> None:
    """Codex's own remote compaction (v2: a streamed create ending in `compaction_trigger`, research
    codex-protocol.md §1.2) triggered mid-turn by a low `model_auto_compact_token_limit`: it goes over the
    socket like any create, through the chain, and Codex completes its turn on the compacted history."""
    async with Emulator(validate_requests=spec_available()) as emu:
        # (no default answer: a create ending in compaction_trigger gets the emulator's compaction item)
        emu.script(FunctionCall("exec_command", {"cmd": "echo compact-me"}, call_id="call_sh"),
                   Text(ANSWER, deltas=3), Text(ANSWER, deltas=3))
        proxy = await proxy_factory(upstream=emu.url)
        code, out, err = await codex_exec_json(tmp_path, proxy.url + "/v1", "run echo, then answer",
                                               'model_auto_compact_token_limit = 1000\n')
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        summary = [(r.route, r.transport, r.status, (r.json.get("input") or [{}])[-1].get("type")) for r in turns]
        assert all(r.transport == "ws" and r.status == 200 for r in turns), summary
        compactions = [r for r in turns if (r.json.get("input") or [{}])[-1].get("type") == "compaction_trigger"]
        assert compactions, summary
        after = turns[turns.index(compactions[0]) + 1:]
        assert any(i.get("type") == "compaction" for r in after for i in r.json.get("input") or []), summary
        assert ANSWER in out


async def test_codex_falls_back_to_http_by_itself_when_the_upstream_refuses_the_upgrade(proxy_factory,
                                                                                        tmp_path) -> None:
    """An upstream without WebSocket mode answers Codex's upgrade with 426: ctproxy hands the client that very
    refusal (not a socket it would have to fail later), so Codex falls back to HTTP by itself and its turn runs
    through the chain as `POST /v1/responses`."""
    async with Emulator(validate_requests=spec_available(), ws_refuse=426) as emu:
        emu.set_default(Text(ANSWER, deltas=5))
        proxy = await proxy_factory(upstream=emu.url)
        code, out, err = await codex_exec(tmp_path, proxy.url + "/v1", "say hi")
        assert code == 0, f"codex exec failed ({code}):\n{err[-3000:]}\nproxy log:\n{proxy.log()[-3000:]}"
        assert ANSWER in out
        refused = [r for r in emu.requests if r.route == "ws_upgrade"]
        assert refused and all(r.status == 426 for r in refused), [(r.route, r.status) for r in emu.requests]
        turns = [r for r in emu.requests if r.route in ("responses", "compaction")]
        assert turns and all(r.transport == "http" and r.status == 200 for r in turns), \
            [(r.transport, r.status) for r in turns]
        for _ in range(300):  # the request log is written after each flow ends
            log = proxy.log()
            if "GET /v1/responses 426" in log and "ctproxy-request POST /v1/responses" in log:
                break
            await asyncio.sleep(0.1)
        assert [ln for ln in log.splitlines() if "ctproxy-request POST /v1/responses" in ln], log[-3000:]
        assert [ln for ln in log.splitlines() if "GET /v1/responses 426" in ln], log[-3000:]
