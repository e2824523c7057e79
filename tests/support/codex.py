"""Codex CLI in the end-to-end tests: where the project's set-up installs it, a fresh environment for one
run, and `codex exec` under a bound that fails the test with Codex's own stderr."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support.optional import require_tool

REPO = Path(__file__).resolve().parents[2]
CODEX = REPO / ".tools" / "node_modules" / ".bin" / "codex"  # 0.171.0 (scripts/bootstrap.sh CODEX_VERSION)
LEGACY_CODEX = REPO / ".tools" / "legacy" / "node_modules" / ".bin" / "codex"  # 0.169.0, for one smoke test


def codex_binary(*, legacy: bool = False) -> Path:
    """The installed Codex CLI (scripts/bootstrap.sh puts 0.171 in .tools/, 0.169 in .tools/legacy/); the test
    skips with the set-up's reason where it could not be installed."""
    if legacy:
        return require_tool("codex-legacy", LEGACY_CODEX, "Codex CLI 0.169 (npm @openai/codex, in .tools/legacy)")
    return require_tool("codex", CODEX, "Codex CLI 0.171 (npm @openai/codex)")


def isolated_dirs(tmp: Path) -> tuple[Path, Path, Path]:
    """(HOME, CODEX_HOME, working directory) of one run, created."""
    dirs = tmp / "home", tmp / "codex-home", tmp / "work"
    for d in dirs:
        d.mkdir(parents=True, exist_ok=True)
    return dirs


def codex_env(home: Path, codex_home: Path, **extra: str) -> dict[str, str]:
    """Nothing of the developer's own Codex set-up: a fresh HOME and CODEX_HOME, no colours."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "CODEX_HOME": str(codex_home),
            "NO_COLOR": "1", "LANG": "C.UTF-8", **extra}


async def run_codex(args: list[str], cwd: Path, env: dict[str, str], timeout: float, *,
                    legacy: bool = False) -> tuple[int, bytes, bytes]:
    """`codex <args>` to its end, or the test fails after `timeout` seconds with the tail of its stderr."""
    proc = await asyncio.create_subprocess_exec(
        str(codex_binary(legacy=legacy)), *args, cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
        pytest.fail(f"codex {args[0]} did not finish within {timeout:.0f} s; stderr tail:\n{err.decode()[-2000:]}")
    return proc.returncode or 0, out, err
