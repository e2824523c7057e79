"""Pi in the end-to-end tests: where the project's set-up installs it, the Node it runs on, and `pi` under a
bound that fails the test with Pi's own stderr.

Pi 1.6 (npm `@earendil-works/pi-coding-agent`) needs Node >= 22.19; where the system's Node is older,
scripts/bootstrap.sh puts npm's Node 22 binary in .tools/node22/, and Pi runs on it (its `#!/usr/bin/env node`
finds that first on PATH). Pi 0.73.1, the last under the old name `@mariozechner/pi-coding-agent`, stays in
.tools/legacy/ for one smoke test.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support.optional import require_tool

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".tools"
PI = TOOLS / "node_modules" / ".bin" / "pi"
LEGACY_PI = TOOLS / "legacy" / "node_modules" / ".bin" / "pi"
NODE22_BIN = TOOLS / "node22" / "node_modules" / ".bin"
KEY = "sk-client-test-not-real"


def pi_binary(*, legacy: bool = False) -> Path:
    """The installed Pi (1.6, or 0.73.1 with `legacy`); the test skips with the set-up's reason where it could not
    be installed."""
    if legacy:
        return require_tool("pi-legacy", LEGACY_PI, "Pi 0.73.1 (npm @mariozechner/pi-coding-agent, in .tools/legacy)")
    return require_tool("pi", PI, "Pi 1.6 (npm @earendil-works/pi-coding-agent)")


def pi_env(home: Path, agent_dir: Path, **extra: str) -> dict[str, str]:
    """A fresh HOME and Pi config dir, no colours; Node 22 first on PATH where the set-up installed it."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    if (NODE22_BIN / "node").exists():
        path = f"{NODE22_BIN}:{path}"
    return {"PATH": path, "HOME": str(home), "PI_CODING_AGENT_DIR": str(agent_dir), "OPENAI_API_KEY": KEY,
            "NO_COLOR": "1", "LANG": "C.UTF-8", **extra}


async def run_pi(binary: Path, args: list[str], cwd: Path, env: dict[str, str],
                 timeout: float) -> tuple[int, bytes, bytes]:
    """`pi <args>` to its end, or the test fails after `timeout` seconds with the tail of its stderr."""
    proc = await asyncio.create_subprocess_exec(
        str(binary), *args, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"pi did not finish within {timeout:.0f} s; stderr tail:\n{err.decode()[-2000:]}")
    return proc.returncode or 0, out, err
