"""`--state-dir` and `--config` work in every position, for every command (issue 10, point 7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.app.cli_parser import build_parser

REPO = Path(__file__).resolve().parents[3]

# Every command line the CLI has, as (words before the options' slot, words after it).
COMMANDS: list[list[str]] = [
    ["up"],
    ["status"],
    ["status", "--json"],
    ["replay", "x.mitm"],
    ["token"],
    ["config", "show"],
    ["config", "get", "shell.enabled"],
    ["config", "set", "shell.enabled", "true"],
    ["tasks"],
    ["task", "new"],
    ["codex-config"],
    ["codex-config", "--no-mcp"],
]


def _positions(words: list[str]) -> list[list[str]]:
    """The options before the command, right after each word of it, and at the end."""
    opts = ["--state-dir", "/tmp/sd", "--config", "/tmp/cf.json"]
    return [words[:i] + opts + words[i:] for i in range(len(words) + 1)]


@pytest.mark.parametrize("words", COMMANDS, ids=" ".join)
def test_every_position_is_accepted_and_parsed(words):
    parser = build_parser()
    for argv in _positions(words):
        args = parser.parse_args(argv)
        assert args.state_dir == Path("/tmp/sd"), argv
        assert args.config == Path("/tmp/cf.json"), argv


def test_defaults_are_none_when_not_given():
    args = build_parser().parse_args(["task", "new"])
    assert args.state_dir is None and args.config is None


def test_the_innermost_value_wins():
    args = build_parser().parse_args(["--state-dir", "/a", "config", "--state-dir", "/b", "show"])
    assert args.state_dir == Path("/b")
    args = build_parser().parse_args(["--state-dir", "/a", "config", "show"])
    assert args.state_dir == Path("/a")  # a subcommand that does not repeat it keeps the outer one


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.app.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env}, timeout=120)


def test_options_after_the_subcommand_take_effect(tmp_path):
    # CTPROXY_HOME points elsewhere: only the option may decide where things go.
    env = {"CTPROXY_HOME": str(tmp_path / "wrong-home")}
    env.pop("CTPROXY_CONFIG", None)
    home = tmp_path / "home"
    cfg = tmp_path / "other-config.json"

    out = _run("task", "new", "--state-dir", str(home), env=env)
    assert out.returncode == 0, out.stderr
    assert (home / "ctproxy.db").exists()

    out = _run("config", "set", "shell.enabled", "true", "--state-dir", str(home), env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads((home / "config.json").read_text()) == {"shell": {"enabled": True}}

    out = _run("config", "set", "notes.enabled", "false", "--config", str(cfg), "--state-dir", str(home), env=env)
    assert out.returncode == 0, out.stderr
    assert json.loads(cfg.read_text()) == {"notes": {"enabled": False}}
    out = _run("config", "--config", str(cfg), "get", "--state-dir", str(home), "notes.enabled", env=env)
    assert out.returncode == 0 and json.loads(out.stdout) is False

    token = _run("--state-dir", str(home), "token", env=env)
    assert token.returncode == 0, token.stderr
    assert token.stdout.strip() == (home / "token").read_text().strip()

    status = _run("status", "--json", "--state-dir", str(home), "--config", str(cfg), env=env)
    assert status.returncode == 0, status.stderr
    info = json.loads(status.stdout)
    assert info["state_dir"] == str(home.resolve()) and info["config"] == str(cfg)
    assert not (tmp_path / "wrong-home").exists()
