"""Apply a patch through a chosen transport and snapshot trees, for the conformance tests."""

from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools_server.patch import PatchFamily
from tools_server.registry import CallContext, Services

SCENARIOS = Path(__file__).parent / "scenarios"
TRANSPORTS = ("direct", "rest", "mcp")


@dataclass
class Outcome:
    ok: bool
    text: str
    details: dict[str, Any] = field(default_factory=dict)


Apply = Callable[[dict[str, Any], Path], Awaitable[Outcome]]


def scenario_names() -> list[str]:
    return sorted(p.name for p in SCENARIOS.iterdir() if p.is_dir())


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under `root`, relative path -> bytes."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def prepare(name: str, workspace: Path) -> tuple[str, dict[str, bytes]]:
    """Copy the scenario's input into `workspace`; return the patch text and the expected tree."""
    folder = SCENARIOS / name
    workspace.mkdir(parents=True, exist_ok=True)
    if (folder / "input").is_dir():
        shutil.copytree(folder / "input", workspace, dirs_exist_ok=True)
    patch = (folder / "patch.txt").read_bytes().decode("utf-8")
    return patch, snapshot(folder / "expected")


def direct_applier(services_for: Callable[[Path], Services]) -> Apply:
    async def apply(arguments: dict[str, Any], workspace: Path) -> Outcome:
        services = services_for(workspace)
        tool = PatchFamily(services).tool
        result = await tool.call(arguments, CallContext(services=services))
        return Outcome(not result.is_error, result.text, result.details)

    return apply


def server_applier(start_server: Callable[..., Awaitable[Any]], transport: str) -> Apply:
    """`start_server` is the `tool_server` fixture's factory; one server per workspace."""

    async def apply(arguments: dict[str, Any], workspace: Path) -> Outcome:
        srv = await start_server({"apply_patch.enabled": True}, workspace=workspace)
        if transport == "rest":
            res = await srv.rest("apply_patch", arguments)
            return Outcome(res.ok, res.text or res.body.get("error", {}).get("message", ""), res.details)
        res = await srv.mcp("apply_patch", arguments)
        return Outcome(not res.is_error, res.text, res.structured or {})

    return apply
