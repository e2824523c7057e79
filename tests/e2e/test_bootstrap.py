"""scripts/bootstrap.sh the way a fresh machine runs it (issue 27): nothing optional can stop it.

The set-up runs in a copy of the repository whose .venv is already complete (a stamp, and a `python` that runs
the real virtualenv's but whose `pip install` fails as with no registry), so what is exercised is the optional
part: npm clients, PyPI clients, Debian packages. PATH shims give it a `dpkg-query` that knows no package, an
`apt-get` and an `npm` that fail; or no apt-get, dpkg-query or npm at all.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.optional import require_tool, skip_reason

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
OPTIONAL = {"codex", "pi", "conformance", "codex-legacy", "pi-legacy", "openai-agents", "litellm", "desktop",
            "chromium", "sandbox", "postgresql"}
# What the script itself needs from PATH when nothing optional is there.
BASICS = ["bash", "env", "dirname", "sha256sum", "cut", "cat", "rm", "grep", "tail", "mkdir", "id", "sort", "tr",
          "ls", "head", "sed"]


def _script(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)


def fresh_copy(tmp: Path, *, installed: bool = True) -> Path:
    """A checkout with the set-up script and pyproject, and a .venv whose pip cannot reach a registry."""
    repo = tmp / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(REPO / "scripts" / "bootstrap.sh", repo / "scripts" / "bootstrap.sh")
    shutil.copy2(REPO / "pyproject.toml", repo / "pyproject.toml")
    venv_bin = repo / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    _script(venv_bin / "python",
            'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then\n'
            '  echo "ERROR: Could not find a version that satisfies the requirement (no registry reachable)" >&2\n'
            '  exit 1\nfi\n'
            f'exec "{sys.executable}" "$@"')
    (venv_bin / "ctproxy").symlink_to(VENV_BIN / "ctproxy")
    if installed:
        digest = hashlib.sha256((repo / "pyproject.toml").read_bytes()).hexdigest()
        (repo / ".venv" / ".ctproxy-installed").write_text(digest + "\n")
    return repo


def failing_shims(tmp: Path) -> Path:
    shims = tmp / "shims"
    shims.mkdir()
    _script(shims / "dpkg-query", 'echo "dpkg-query: no packages found matching $*" >&2; exit 1')
    _script(shims / "apt-get", 'echo "E: Unable to locate package (no package source reachable)" >&2; exit 100')
    _script(shims / "npm", 'echo "npm error code E404 (no registry reachable)" >&2; exit 1')
    return shims


def bare_path(tmp: Path) -> Path:
    """A PATH with only what a shell script needs: no apt-get, no dpkg-query, no npm, no sudo."""
    bare = tmp / "bare"
    bare.mkdir()
    for name in BASICS:
        exe = shutil.which(name)
        assert exe, f"{name} is on every Linux machine"
        (bare / name).symlink_to(exe)
    return bare


def run_setup(repo: Path, path: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": str(repo.parent / "home"), "LANG": "C.UTF-8"}
    return subprocess.run(["bash", str(repo / "scripts" / "bootstrap.sh")], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)


def _node_is_new_enough() -> bool:
    node = shutil.which("node")
    if node is None:
        return False
    done = subprocess.run([node, "-p", "process.versions.node"], capture_output=True, text=True, timeout=60)
    major, minor = (int(x) for x in done.stdout.strip().split(".")[:2])
    return (major, minor) >= (22, 19)


def skipped_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("bootstrap: skipped ")]


def check_completed(repo: Path, out: subprocess.CompletedProcess[str], tmp: Path,
                    node22: bool = True) -> dict[str, str]:
    """`node22`: the machine's PATH has no Node >= 22.19, so the set-up tried npm's Node 22 for Pi 1.6 too."""
    assert out.returncode == 0, out.stderr
    lines = skipped_lines(out.stderr)
    expected = OPTIONAL | ({"node22"} if node22 else set())
    # One line for each optional part, saying what it costs.
    assert len(lines) == len(expected), out.stderr
    for what in ("Codex CLI ", "Pi ", "Codex CLI 0.169", "Pi 0.73", "the MCP conformance suite", "openai-agents",
                 "litellm", "the Computer Use desktop", "Chromium", "bubblewrap",
                 "PostgreSQL") + (("Node 22",) if node22 else ()):
        assert sum(line.startswith(f"bootstrap: skipped {what}") for line in lines) == (
            2 if what in ("Codex CLI ", "Pi ") else 1), (what, out.stderr)
    assert all("skip" in line.split(";", 1)[1] or "unavailable" in line for line in lines), lines
    assert "ctproxy itself is complete" in out.stdout
    record = json.loads((repo / ".venv" / "ctproxy-setup.json").read_text())["skipped"]
    assert set(record) == expected
    # ctproxy runs.
    status = subprocess.run([str(repo / ".venv" / "bin" / "ctproxy"), "status", "--state-dir", str(tmp / "state")],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0, status.stderr
    assert "web_search" in status.stdout
    return record


def test_failing_dpkg_apt_and_npm_are_skipped_with_a_line_each(tmp_path):
    repo = fresh_copy(tmp_path)
    out = run_setup(repo, f"{failing_shims(tmp_path)}:{os.environ['PATH']}")
    record = check_completed(repo, out, tmp_path, node22=not _node_is_new_enough())
    assert "E404" in record["codex"] and "E404" in record["conformance"]
    assert "E404" in record["codex-legacy"] and "E404" in record["pi-legacy"]
    if "node22" in record:  # Pi 1.6 then skips for want of a Node to run on, and says so
        assert "E404" in record["node22"] and "22.19" in record["node22"] and "Node >= 22.19" in record["pi"]
    else:
        assert "E404" in record["pi"]
    assert "no registry reachable" in record["litellm"]
    if os.geteuid() == 0:  # root uses apt-get, which fails here
        assert "apt-get could not install" in record["desktop"] and "xvfb" in record["desktop"]
        assert "Unable to locate package" in record["chromium"]
        assert "apt-get could not install bubblewrap" in record["sandbox"]
        assert "apt-get could not install postgresql" in record["postgresql"]
    assert "computer_use stays unavailable" in record["desktop"]


def test_a_machine_without_apt_get_or_npm_completes_the_set_up(tmp_path):
    repo = fresh_copy(tmp_path)
    out = run_setup(repo, str(bare_path(tmp_path)))
    record = check_completed(repo, out, tmp_path)
    assert "apt-get is not usable here" in record["desktop"] and "apt-get is not usable here" in record["chromium"]
    assert "shell sandbox modes are unavailable" in record["sandbox"]
    assert "private PostgreSQL server" in record["postgresql"] and "apt-get is not usable" in record["postgresql"]
    assert "npm is not installed" in record["codex"] and "npm is not installed" in record["pi-legacy"]
    assert "absent" in record["node22"] and "npm is not installed" in record["node22"]  # no node on that PATH
    assert "npm is not installed" in record["conformance"]


def test_a_required_install_that_fails_stops_with_what_to_do(tmp_path):
    repo = fresh_copy(tmp_path, installed=False)
    out = run_setup(repo, f"{failing_shims(tmp_path)}:{os.environ['PATH']}")
    assert out.returncode == 1
    assert "could not install ctproxy's Python dependencies" in out.stderr and "PIP_INDEX_URL" in out.stderr
    assert not (repo / ".venv" / ".ctproxy-installed").exists()


def test_a_test_whose_package_was_skipped_skips_with_the_set_ups_reason(tmp_path, monkeypatch):
    import tests.support.optional as optional

    record = tmp_path / "ctproxy-setup.json"
    record.write_text(json.dumps({"skipped": {"pi": "Pi: npm install failed: E404; its end-to-end tests skip"}}))
    monkeypatch.setattr(optional, "RECORD", record)
    assert "the set-up skipped Pi: npm install failed: E404" in skip_reason("pi", "Pi", record)
    with pytest.raises(pytest.skip.Exception, match="the set-up skipped Pi: npm install failed"):
        optional.require_tool("pi", tmp_path / "no-such-pi", "Pi")
    assert require_tool("pi", Path(sys.executable), "Pi") == Path(sys.executable)  # present: no skip
