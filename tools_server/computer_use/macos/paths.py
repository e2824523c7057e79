"""The one bundled runtime the macOS backend may use: no PATH lookup, no install, no other copies."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

RESOURCES = Path("/Applications/ChatGPT.app/Contents/Resources")
HELPER = Path("computer-use") / "Codex Computer Use.app"


@dataclass(frozen=True)
class Runtime:
    codex: Path  # the app-server (`codex app-server`)
    node_repl: Path  # the one MCP server the ephemeral thread gets
    helper: Path  # the installed Computer Use helper, only checked for


def real_codex_home() -> Path:
    return Path(os.environ.get("CODEX_HOME") or Path.home() / ".codex").expanduser()


def bundled_runtime() -> Runtime:
    return Runtime(RESOURCES / "codex", RESOURCES / "cua_node" / "bin" / "node_repl", real_codex_home() / HELPER)


def unavailable_reason(runtime: Runtime | None = None) -> str | None:
    """Why the macOS backend cannot run here, or None when it can be tried."""
    if runtime is None and sys.platform != "darwin":
        return f"macOS only (ChatGPT.app's bundled Codex app-server); this machine is {sys.platform}"
    rt = runtime or bundled_runtime()
    for what, path in (("codex", rt.codex), ("node_repl", rt.node_repl)):
        if not os.access(path, os.X_OK):
            return f"ChatGPT.app's bundled {what} is missing ({path})"
    if not rt.helper.exists():
        return f"the Codex Computer Use helper is not installed ({rt.helper})"
    return None
