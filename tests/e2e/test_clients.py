"""One tested step per client, as README.md's "Point a client at it" gives it (issue 27): each real client
through a real `ctproxy up` against the emulator, which validates every request as the API would. Each test
also shows how two runs of the same job are kept apart, as the README says for that client.

Codex CLI's custom provider (`ctproxy codex-config`) has its own test in tests/proxy/app/test_cli_codex_config.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.emulator import Emulator
from tests.support.codex import codex_env, isolated_dirs, run_codex
from tests.support.optional import require_module
from tests.support.pi import KEY, pi_binary, pi_env, run_pi

pytestmark = pytest.mark.validate_requests(always=True)

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 180.0




def cli(state: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "proxy.app.cli", *args, "--state-dir", str(state)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def tasks(state: Path) -> list[dict[str, Any]]:
    return json.loads(cli(state, "tasks", "--json"))


def sessions_of(state: Path, task: str) -> list[dict[str, Any]]:
    found = [t for t in tasks(state) if t["task_id"] == task]
    assert found, f"task {task} is not in the journal: {[t['task_id'] for t in tasks(state)]}"
    return [s for agent in found[0]["agents"] for s in agent["sessions"]]


def all_valid(emu: Emulator) -> None:
    """Every request the upstream saw was accepted (the emulator validates bodies and input rules)."""
    assert emu.responses_requests, "the upstream saw no request"
    assert all(r.status == 200 for r in emu.responses_requests), [(r.status, r.path) for r in emu.responses_requests]


# ---- Pi --------------------------------------------------------------------------------------------------

async def pi_print(agent_dir: Path, home: Path, work: Path, prompt: str, *, legacy: bool = False) -> str:
    """`pi -p PROMPT --provider ctproxy` with its own config dir; Pi's answer."""
    code, out, err = await run_pi(pi_binary(legacy=legacy),
                                  ["-p", prompt, "--provider", "ctproxy", "--model", "gpt-5", "--no-session"],
                                  work, pi_env(home, agent_dir), TIMEOUT)
    assert code == 0, f"{err.decode()[-3000:]}\n{out.decode()[-2000:]}"
    return out.decode()


@pytest.mark.parametrize("legacy", [False, True], ids=["pi-1.6", "pi-0.73-legacy"])
async def test_pi_through_the_provider_that_pi_config_writes(emulator, proxy_factory, tmp_path, legacy):
    """Pi 1.6 (today's package name), and Pi 0.73.1 (the old name, still run by users) as the smoke test."""
    pi_binary(legacy=legacy)
    proxy = await proxy_factory(upstream=emulator.url)
    agent_dir, home, work = tmp_path / "pi-agent", tmp_path / "home", tmp_path / "work"
    for d in (agent_dir, home, work):
        d.mkdir()
    models = agent_dir / "models.json"
    models.write_text(json.dumps({"providers": {"mine": {"baseUrl": "http://127.0.0.1:1/v1", "api": "openai-responses",
                                                         "apiKey": "X", "models": [{"id": "m"}]}}}))
    cli(proxy.state_dir, "pi-config", "--write", str(models))
    written = json.loads(models.read_text())
    assert set(written["providers"]) == {"mine", "ctproxy"}  # the user's own provider is kept
    task = written["providers"]["ctproxy"]["headers"]["x-ctp-task"]

    assert "You said: fix the build" in await pi_print(agent_dir, home, work, "fix the build", legacy=legacy)
    # Pi's request reached the upstream through ctproxy, stripped of ctproxy's headers, and was valid.
    all_valid(emulator)
    first = emulator.responses_requests[0]
    assert first.json["model"] == "gpt-5" and first.json.get("prompt_cache_key")
    assert not [k for k, _ in first.headers if k.lower().startswith("x-ctp-")]
    assert sessions_of(proxy.state_dir, task)  # journaled in the task pi-config made

    # Runs kept apart: a second run with its own task (`ctproxy pi-config --task …`) is its own task.
    other = cli(proxy.state_dir, "task", "new").split()[-1]
    cli(proxy.state_dir, "pi-config", "--write", str(models), "--task", other)
    await pi_print(agent_dir, home, work, "fix the build", legacy=legacy)
    assert sessions_of(proxy.state_dir, other) and sessions_of(proxy.state_dir, task)


# ---- the openai SDK -------------------------------------------------------------------------------------

async def test_openai_sdk_runs_kept_apart_by_prompt_cache_key(emulator, proxy_factory):
    from openai import AsyncOpenAI

    proxy = await proxy_factory(upstream=emulator.url)
    client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0)
    try:
        for run in ("run-1", "run-2"):  # the same job twice: the same first input
            answer = await client.responses.create(model="gpt-5", input="summarise the log", prompt_cache_key=run)
            assert answer.output_text == "You said: summarise the log"
    finally:
        await client.close()
    all_valid(emulator)
    keys = {s["session_key"] for t in tasks(proxy.state_dir) for a in t["agents"] for s in a["sessions"]}
    assert len(keys) == 2, keys


# ---- the OpenAI Agents SDK ---------------------------------------------------------------------------------

async def test_agents_sdk_through_ctproxy_with_its_own_task(emulator, proxy_factory):
    agents = require_module("openai-agents", "agents", "the OpenAI Agents SDK (PyPI openai-agents)")
    from openai import AsyncOpenAI

    proxy = await proxy_factory(upstream=emulator.url)
    results = []
    for _ in range(2):  # two runs of the same job, each in its own task (x-ctp-task)
        task = cli(proxy.state_dir, "task", "new").split()[-1]
        client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key=KEY, max_retries=0,
                             default_headers={"x-ctp-task": task})
        model = agents.OpenAIResponsesModel(model="gpt-5", openai_client=client)
        agent = agents.Agent(name="helper", instructions="Be brief.", model=model)
        result = await agents.Runner.run(agent, "list the open issues",
                                         run_config=agents.RunConfig(tracing_disabled=True))
        await client.close()
        results.append((task, result.final_output))
    all_valid(emulator)
    for task, output in results:
        assert output == "You said: list the open issues"
        assert sessions_of(proxy.state_dir, task)
    assert results[0][0] != results[1][0]


# ---- litellm ----------------------------------------------------------------------------------------------

async def test_litellm_responses_through_ctproxy(emulator, proxy_factory):
    litellm = require_module("litellm", "litellm", "litellm (PyPI litellm)")
    proxy = await proxy_factory(upstream=emulator.url)
    task = cli(proxy.state_dir, "task", "new").split()[-1]
    answer = await litellm.aresponses(model="openai/gpt-5", input="tidy the imports", api_base=proxy.url + "/v1",
                                      api_key=KEY, extra_headers={"x-ctp-task": task})
    texts = [part.text for item in answer.output if getattr(item, "type", "") == "message" for part in item.content]
    assert texts == ["You said: tidy the imports"]
    all_valid(emulator)
    assert sessions_of(proxy.state_dir, task)


# ---- Codex CLI, built-in provider pointed at ctproxy --------------------------------------------------------

@pytest.mark.parametrize("legacy", [False, True], ids=["codex-0.171", "codex-0.169-legacy"])
async def test_codex_builtin_provider_with_openai_base_url(emulator, proxy_factory, tmp_path, legacy):
    """Codex 0.171, and Codex 0.169 (the previous release, side by side in .tools/legacy) as the smoke test."""
    proxy = await proxy_factory(upstream=emulator.url)
    home, codex_home, work = isolated_dirs(tmp_path)
    (codex_home / "config.toml").write_text(
        f'model = "gpt-5"\nopenai_base_url = "{proxy.url}/v1"\ncheck_for_update_on_startup = false\n'
        '[analytics]\nenabled = false\n[feedback]\nenabled = false\n[otel]\nexporter = "none"\n')
    last = tmp_path / "last.txt"
    env = codex_env(home, codex_home, OPENAI_API_KEY=KEY)
    code, _, err = await run_codex(["exec", "--skip-git-repo-check", "--output-last-message", str(last),
                                    "count the tests"], work, env, TIMEOUT, legacy=legacy)
    assert code == 0, err.decode()[-3000:]
    assert last.read_text().strip() == "You said: count the tests"
    # Codex speaks the Responses WebSocket in this form; ctproxy runs its creates through the chain.
    turns = [r for r in emulator.requests if r.route == "responses"]
    assert turns and all(r.transport == "ws" and r.status == 200 for r in turns), \
        [(r.transport, r.status) for r in turns]
    # Codex keeps its runs apart by itself: its session id header makes a session of its own.
    sessions = [s for t in tasks(proxy.state_dir) for a in t["agents"] for s in a["sessions"]]
    assert [s["source"] for s in sessions] == ["codex"]


async def test_pis_multi_round_bridged_turn_does_not_make_pi_compact(emulator, proxy_factory, tmp_path):
    """Issue 29 (6) with the real client: a bridged turn of 8 rounds (bridge.max_rounds) shows Pi the last round's
    usage (what its context holds), not the sum. Pi compacts when input tokens exceed its window less 16,384; with
    a 40,000-token window the sum of 8 rounds of 5,000 (40,000) would make it compact, the last round does not."""
    from tests.emulator import FunctionCall, Text

    pi = pi_binary()
    state = tmp_path / "state"
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"model_windows": {"gpt-5": 40_000, "*": 128_000}}))
    await proxy_factory(state_dir=state, upstream=emulator.url, extra_args=["--bridge", "history"])
    agent_dir, home, work = tmp_path / "pi-agent", tmp_path / "home", tmp_path / "work"
    for d in (agent_dir, home, work):
        d.mkdir()
    cli(state, "pi-config", "--write", str(agent_dir / "models.json"))
    assert json.loads((agent_dir / "models.json").read_text())["providers"]["ctproxy"]["models"][0][
        "contextWindow"] == 40_000
    rounds = [FunctionCall("history_list_windows", {}, call_id=f"call_{i}", usage={"input_tokens": 5_000,
                                                                                  "output_tokens": 20})
              for i in range(7)]
    emulator.script(*rounds, Text("looked it up", usage={"input_tokens": 5_000, "output_tokens": 20}))
    code, out, err = await run_pi(pi, ["-p", "what windows are there?", "--provider", "ctproxy", "--model", "gpt-5",
                                       "--mode", "json"], work, pi_env(home, agent_dir), TIMEOUT)
    assert code == 0, err.decode()[-3000:]
    events = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    assert not [e for e in events if e.get("type") == "compaction_start"], "Pi compacted its session"
    all_valid(emulator)
    assert len(emulator.responses_requests) == 8  # the bridged rounds; no summarisation request from Pi
    usages = [e["message"]["usage"] for e in events if e.get("type") == "message_end"
              and isinstance(e.get("message"), dict) and e["message"].get("role") == "assistant"
              and isinstance(e["message"].get("usage"), dict)]
    assert usages and all(u.get("input", 0) <= 5_000 for u in usages), usages
