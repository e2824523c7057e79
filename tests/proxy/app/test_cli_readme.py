"""The README tells a new user how to reach `ctproxy` after its two commands (issue 10, point 16), and the
commands it documents are the ones the CLI has."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.app.cli_parser import build_parser

REPO = Path(__file__).resolve().parents[3]
README = (REPO / "README.md").read_text()


def test_the_two_commands_are_intact():
    block = README.split("## The two commands", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make up", "make test"]


def test_readme_says_where_ctproxy_is():
    assert ".venv/bin/ctproxy" in README
    assert "source .venv/bin/activate" in README
    assert 'make ctproxy ARGS="' in README


def test_make_ctproxy_runs_the_installed_command():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed here")
    out = subprocess.run([make, "-n", "ctproxy", "ARGS=status --json"], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert ".venv/bin/ctproxy status --json" in out.stdout


def test_every_command_in_the_readme_exists():
    parser = build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    mentioned = set(re.findall(r"`ctproxy ([a-z][a-z-]*)", README))
    assert mentioned, "the README names no ctproxy command"
    assert mentioned <= commands, mentioned - commands
    assert commands <= mentioned, f"not in the README: {commands - mentioned}"
