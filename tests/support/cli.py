"""`ctproxy` as a user runs it, for the tests: `python -m proxy.app.cli ARGS` from the repository's root, with the
test's environment (plus `env`), its output captured as text. One helper for every test that drives the command
line (it was copied into ten files)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ctproxy(*args: str, env: Mapping[str, str] | None = None, timeout: float = 120,
            check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy.app.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, timeout=timeout, check=check)


def ctproxy_out(state_dir: Path, *args: str, timeout: float = 120) -> str:
    """`ctproxy COMMAND --state-dir STATE REST…`: its standard output, the command's success asserted."""
    command, *rest = args
    done = ctproxy(command, "--state-dir", str(state_dir), *rest, timeout=timeout)
    assert done.returncode == 0, done.stderr
    return done.stdout
