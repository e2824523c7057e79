"""`ctproxy tasks` / `ctproxy show` (issue 17): newest first, a label per task, --json, --limit; a session's
windows and items, one item whole; and every command's --help complete."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
from openai import AsyncOpenAI

from proxy.app import cli
from tests.support.proxyproc import REPO

WINDOW = 20_000  # tokens; threshold 0.8: the session below is compacted once (a second window)
CONFIG = {"remote_compaction": {"enabled": True}, "model_windows": {"gpt-test*": WINDOW, "*": 128_000}}
TURN = "x" * 5_800  # ≈ 1,450 tokens per user turn
TURNS = 13


async def drive_compacted_session(proxy_url: str, turns: int = TURNS) -> list[str]:
    """A stateless SDK client resending its history; crossing the threshold makes one remote compaction."""
    client = AsyncOpenAI(base_url=proxy_url + "/v1", api_key="sk-test-views", max_retries=0)
    history: list[dict] = []
    ids = []
    for i in range(1, turns + 1):
        history.append({"role": "user", "content": f"turn {i}: please {TURN}"})
        answer = await client.responses.create(model="gpt-test-1", input=history, store=False)
        ids.append(answer.id)
        history.append({"role": "assistant", "content": answer.output_text})
    await client.close()
    return ids


def write_config(state_dir: Path) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "config.json").write_text(json.dumps(CONFIG))


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
async def journaled(emulator, proxy_factory, tmp_path):
    state = tmp_path / "state-views"
    write_config(state)
    proxy = await proxy_factory(upstream=emulator.url, state_dir=state)
    await drive_compacted_session(proxy.url)
    await proxy.astop()  # the journal is flushed on stop
    return state


async def test_tasks_and_show(journaled, capsys):
    state = str(journaled)
    code, out, _ = run_cli(capsys, "tasks", "--json", "--state-dir", state)
    assert code == 0
    tasks = json.loads(out)
    assert len(tasks) == 1
    task = tasks[0]
    assert "turn 1: please" in task["label"] and "/root" in task["label"]  # first user words, agent names
    session = task["agents"][0]["sessions"][0]
    strategies = [w["strategy"] for w in session["windows"]]
    assert len(strategies) >= 2 and "remote" in strategies[1:], strategies  # the compaction opened a window
    assert session["responses"] == TURNS

    # A newer task comes first; --limit keeps the newest.
    code, new_id, _ = run_cli(capsys, "task", "new", "--state-dir", state)
    new_id = new_id.strip()
    code, out, _ = run_cli(capsys, "tasks", "--json", "--limit", "1", "--state-dir", state)
    assert [t["task_id"] for t in json.loads(out)] == [new_id]
    code, out, _ = run_cli(capsys, "tasks", "--state-dir", state)
    assert out.index(new_id) < out.index(task["task_id"]) and "turn 1: please" in out

    # show SESSION (a prefix is enough): windows, then items with role/type/preview.
    key = session["session_key"]
    code, out, _ = run_cli(capsys, "show", key[:10], "--state-dir", state)
    assert code == 0
    assert f"session {key}" in out and "windows:" in out and " remote " in out
    assert "user/message" in out and "assistant/message" in out and "turn 1: please" in out
    assert TURN not in out  # previews are clipped
    # show TASK lists its sessions the same way.
    code, out_task, _ = run_cli(capsys, "show", task["task_id"], "--state-dir", state)
    assert f"session {key}" in out_task
    # --item prints one whole.
    code, out, _ = run_cli(capsys, "show", key, "--json", "--limit", "3", "--state-dir", state)
    shown = json.loads(out)[0]
    assert len(shown["item_list"]) == 3
    first_user = next(i for i in shown["item_list"] if i["role"] == "user")
    code, out, _ = run_cli(capsys, "show", key, "--item", first_user["item_id"], "--state-dir", state)
    assert code == 0 and TURN in out and first_user["item_id"] in out


def test_show_unknown_and_bad_limit(tmp_path, capsys):
    code, _, err = run_cli(capsys, "show", "nope", "--state-dir", str(tmp_path))
    assert code == 1 and "ctproxy tasks" in err
    code, _, err = run_cli(capsys, "tasks", "--limit", "0", "--state-dir", str(tmp_path))
    assert code == 2
    code, out, _ = run_cli(capsys, "tasks", "--json", "--state-dir", str(tmp_path))
    assert json.loads(out) == []


def _actions(parser: argparse.ArgumentParser, path: str = "ctproxy"):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _actions(sub, f"{path} {name}")
        elif not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield path, action


def test_every_option_of_every_command_has_help():
    missing = [f"{path} {'/'.join(a.option_strings) or a.dest}" for path, a in _actions(cli.build_parser())
               if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_tools_server_help_is_complete():
    out = subprocess.run([sys.executable, "-m", "tools_server", "--help"], capture_output=True, text=True, cwd=REPO,
                         check=True).stdout
    for option in ("--listen", "--state-dir", "--config", "--workspace", "--enable", "--disable", "--debug",
                   "--proxy-telemetry", "--parent-pid"):
        assert option in out, option
    entries = out.split("\n  -")[1:]
    assert len(entries) >= 9
    for entry in entries:
        _flags, _, rest = entry.partition("  ")
        assert rest.strip() or "\n" in entry.strip(), f"-{entry!r} has no help"
