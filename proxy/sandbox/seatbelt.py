"""The shell sandbox on macOS (issue 33): a Seatbelt profile for `sandbox-exec`, as Codex confines commands there.

proxy/sandbox/bwrap.py wraps every command with `seatbelt_argv` when `sys.platform` is darwin, after one probe of
this machine (`seatbelt_probe`: sandbox-exec is there *and* a command ran under this profile). ctproxy's
tests run on Linux: they check the profile text and the decisions with the platform and the probe faked
(tests/tools_server/shell/test_shell_sandbox.py); what Seatbelt then enforces on a Mac is not tested here. The same
rules as
bubblewrap's (proxy/sandbox/bwrap.py), within what Seatbelt can do:
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
    """`sandbox-exec -p PROFILE -D…=… --`: prepend to `SHELL -c CMD` (macOS has no prlimit: `limits_argv`).
    Seatbelt matches real paths (/tmp is /private/tmp there): pass resolved ones."""
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
    """The first check on macOS: that sandbox-exec is there (`seatbelt_probe` then runs a command under it)."""
    import os

    present = os.access(sandbox_exec, os.X_OK) if exists is None else exists
    if not present:
        return f"Seatbelt's {sandbox_exec} is not an executable here"
    return None


def seatbelt_probe(sandbox_exec: str = SANDBOX_EXEC) -> str | None:
    """The second check: `/usr/bin/true` runs under the workspace-write profile (network off) with real
    parameters, so the profile parses and sandbox-exec may apply it in this session (it cannot inside another
    sandbox). None when it ran; else why not."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ctproxy-seatbelt-") as tmp:
        root = Path(tmp).resolve()
        for name in ("ws", "state", "tmp"):
            (root / name).mkdir()
        argv = seatbelt_argv("workspace-write", False, root / "ws", root / "state", root / "tmp",
                             [root / "ws" / ".git"], sandbox_exec=sandbox_exec)
        try:
            out = subprocess.run([*argv, "/usr/bin/true"], stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"Seatbelt ({sandbox_exec}) cannot run: {type(exc).__name__}"
    if out.returncode != 0:
        said = out.stderr.decode("utf-8", "replace").strip().splitlines()
        return (f"Seatbelt ({sandbox_exec}) refused a probe command: "
                f"{said[-1][:200] if said else f'exit {out.returncode}'}")
    return None


def limits_argv(cpu_seconds: int, address_space_mb: int) -> list[str]:
    """macOS has no prlimit and no cgroups: CPU time and address space per process by the shell's `ulimit`
    (`ulimit -u` is per user there, so a process count is not set: status says so)."""
    script = ""
    if cpu_seconds:
        script += f"ulimit -t {cpu_seconds} && "
    if address_space_mb:
        script += f"ulimit -v {address_space_mb * 1024} && "
    return ["/bin/sh", "-c", script + 'exec "$@"', "sh"] if script else []
