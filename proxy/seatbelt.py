"""The shell sandbox on macOS (issue 33): a Seatbelt profile for `sandbox-exec`, as Codex confines commands there.

Pure functions, tested on Linux (tests/test_shell_sandbox.py); not run on a Mac by ctproxy's tests. The same
rules as bubblewrap's (proxy/sandbox.py), within what Seatbelt can do:
- reads are allowed everywhere except ctproxy's state directory;
- writes are denied except the workspace (workspace-write; its `.git`, `.agents`, `.codex` excluded), a private
  per-job temporary directory (`TMPDIR`; Seatbelt cannot give a job its own /tmp, so /tmp itself is not
  writable) and the terminal devices;
- the network is denied unless `shell.network`;
- processes may fork and exec and signal only their own sandbox.
Paths go in as parameters (`-D NAME=value`), never spliced into the profile text.
"""

from __future__ import annotations

from pathlib import Path

SANDBOX_EXEC = "/usr/bin/sandbox-exec"

_BASE = """(version 1)
(deny default)
(allow process-exec)
(allow process-fork)
(allow signal (target same-sandbox))
(allow process-info* (target same-sandbox))
(allow sysctl-read)
(allow mach-lookup)
(allow ipc-posix-sem)
(allow ipc-posix-shm-read* ipc-posix-shm-write-data)
(allow pseudo-tty)
(allow file-read*)
(deny file-read* (subpath (param "STATE_DIR")))
(allow file-write* (subpath (param "JOB_TMPDIR")))
(allow file-write-data (literal "/dev/null") (literal "/dev/zero") (literal "/dev/tty") (regex #"^/dev/ttys[0-9]+$"))
(allow file-ioctl (literal "/dev/null") (literal "/dev/zero") (literal "/dev/tty") (regex #"^/dev/ttys[0-9]+$"))
"""


def seatbelt_profile(mode: str, network: bool, protected: int = 0) -> str:
    """The profile text for a sandboxed mode; `protected`: how many PROTECTED_<i> parameters are passed."""
    if mode not in ("workspace-write", "read-only"):
        raise ValueError(f"no Seatbelt profile for {mode!r}")
    text = _BASE
    if mode == "workspace-write":
        excluded = "".join(f' (require-not (subpath (param "PROTECTED_{i}")))' for i in range(protected))
        text += f'(allow file-write* (require-all (subpath (param "WORKSPACE")){excluded}))\n'
    if network:
        text += "(allow network*)\n(allow system-socket)\n"
    return text


def seatbelt_argv(mode: str, network: bool, workspace: Path, state_dir: Path, job_tmpdir: Path,
                  protected: list[Path], *, sandbox_exec: str = SANDBOX_EXEC) -> list[str]:
    """`sandbox-exec -p PROFILE -D…=… --`: prepend to `prlimit`-less `SHELL -c CMD` (macOS has no prlimit)."""
    params = [f"-DSTATE_DIR={state_dir}", f"-DJOB_TMPDIR={job_tmpdir}", f"-DWORKSPACE={workspace}"]
    params += [f"-DPROTECTED_{i}={path}" for i, path in enumerate(protected)]
    return [sandbox_exec, "-p", seatbelt_profile(mode, network, len(protected)), *params, "--"]


def backend_for(platform: str) -> str | None:
    """Which sandbox a platform (`sys.platform`) uses: bubblewrap on Linux, Seatbelt on macOS, else none."""
    if platform.startswith("linux"):
        return "bubblewrap"
    if platform == "darwin":
        return "seatbelt"
    return None


def seatbelt_problem(sandbox_exec: str = SANDBOX_EXEC, exists: bool | None = None) -> str | None:
    """What was checked on macOS: that sandbox-exec is there (the profile itself is not probed)."""
    import os

    present = os.access(sandbox_exec, os.X_OK) if exists is None else exists
    if not present:
        return f"Seatbelt's {sandbox_exec} is not an executable here"
    return None
