"""The workspace: the one directory tree that file and shell tools (apply_patch, exec_command,
write_stdin) may work in.

There is no default. A tool server started without `--workspace DIR` has no workspace, and those
tools answer a clear error that says how to set one, instead of silently editing whatever directory
the server happened to start in (under `make up`, ctproxy's own checkout). With a workspace, a client
may pick a directory inside it per session with the `x-ctp-cwd` header (relative to the workspace, or
absolute inside it); a header that leaves the workspace is refused, never followed.

Like `tools_server.patch.paths`, this is a containment check made before anything runs (the real
path of the directory must be inside the real path of the workspace), not a sandbox: a shell command
can still `cd` anywhere, which is why the README calls the shell tools remote code execution.
"""

from __future__ import annotations

import os
from pathlib import Path

from proxy.errors import CtproxyError
from tools_server.registry import Services, ToolError

NO_WORKSPACE = "no_workspace"


def no_workspace_message(tool: str) -> str:
    return (f"{tool}: no workspace is set, so this tool may not touch any directory. Start ctproxy with "
            "--workspace DIR (`ctproxy up --workspace DIR`, or `python -m tools_server --workspace DIR`); "
            "a client may then send the x-ctp-cwd header with a directory inside DIR.")


def require(services: Services, tool: str) -> Path:
    """The workspace root, or the `no_workspace` tool error."""
    if services.workspace is None:
        raise ToolError(no_workspace_message(tool), code=NO_WORKSPACE)
    return services.workspace


class OutsideWorkspace(CtproxyError, ValueError):
    """A directory that is not inside the workspace (or cannot be named at all)."""


def inside(root: Path, *parts: str | os.PathLike[str] | None) -> Path:
    """Resolve each given directory against the last (the first against `root`); each must stay inside
    the real `root`. Returns the path as spelled (symlinks kept, so `pwd` shows what the caller asked
    for). Existence is the caller's check."""
    real_root = os.path.realpath(root)
    spelled = root_spelled = os.path.normpath(os.path.abspath(root))
    for part in parts:
        if part is None or os.fspath(part) == "":
            continue
        text = os.fspath(part)
        if "\x00" in text:
            raise OutsideWorkspace("a directory name must not contain NUL")
        candidate = os.path.normpath(os.path.join(spelled, text))
        real = os.path.realpath(candidate)
        if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
            shown = text if len(text) <= 200 else text[:200] + "…"
            raise OutsideWorkspace(f"directory '{shown}' is outside the workspace {root_spelled}; "
                                   "give a directory inside it (relative paths resolve against it)")
        spelled = candidate
    return Path(spelled)
