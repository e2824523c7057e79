"""The shell sandbox (issue 33): bubblewrap argv, per-job limits, and the one probe of this machine.

Pure functions plus one cached probe, shared by `ctproxy status` (proxy/status.py) and the tool server's
spawn (tools_server/shell/manager.py), so what status says is what the spawn does. On macOS the same modes
wrap commands with `sandbox-exec` and a Seatbelt profile instead (proxy/seatbelt.py), after its own probe.

Modes, named as Codex names them:
- `workspace-write` (default): the filesystem is read-only except the workspace and a private /tmp (tmpfs);
  the workspace's `.git` is re-bound read-only; ctproxy's state directory is covered by an empty read-only
  tmpfs; a new network namespace unless `shell.network`; a new pid namespace, the sandbox dies with its
  job (`--die-with-parent`) and runs in a new session (`--new-session`, no terminal injection).
- `read-only`: the same, with the workspace read-only too: only the private /tmp is writable.
- `danger-full-access`: no sandbox (the behaviour before issue 33).

bubblewrap sets no_new_privs; it drops every capability (also when ctproxy runs as root). On x86_64 it also
installs a seccomp filter ctproxy builds here (`seccomp_program`: mount, namespaces, ptrace, modules, keys, BPF,
io_uring … get EPERM); on other CPUs there is none, and status says so.

Per-job limits (`prlimit`, applied inside the sandbox after its namespaces exist): CPU seconds and address
space per process, and a process count. The kernel never applies RLIMIT_NPROC to root, so as root the process
count is not enforced (status says so).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from proxy.seatbelt import SANDBOX_EXEC, backend_for, limits_argv, seatbelt_argv, seatbelt_probe, seatbelt_problem

MODES: tuple[str, ...] = ("workspace-write", "read-only", "danger-full-access")
UNSANDBOXED = "danger-full-access"
READ_ONLY = "read-only"
# re-bound read-only inside a writable workspace, as Codex does (apply_patch refuses them too); only those that exist
PROTECTED = (".git", ".agents", ".codex")


@dataclass(frozen=True)
class Limits:
    cpu_seconds: int = 0  # 0: none
    address_space_mb: int = 0
    processes: int = 0

    def argv(self, prlimit: str) -> list[str]:
        opts = []
        if self.cpu_seconds:
            opts.append(f"--cpu={self.cpu_seconds}")
        if self.address_space_mb:
            opts.append(f"--as={self.address_space_mb * 1024 * 1024}")
        if self.processes:
            opts.append(f"--nproc={self.processes}")
        return [prlimit, *opts, "--"] if opts else []


def limits_of(shell: object) -> Limits:
    """The per-job limits of a `ShellConfig`."""
    return Limits(getattr(shell, "cpu_limit_s", 0), getattr(shell, "memory_limit_mb", 0),
                  getattr(shell, "max_processes", 0))


def protected_part(path: str, workspace: str) -> str | None:
    """The protected name (`.git`) that `path` (absolute, normalised) lies in or is, directly under the
    workspace; None when it touches none. apply_patch refuses these in a sandboxed mode, as bubblewrap does."""
    rel = os.path.relpath(path, workspace)
    first = rel.split(os.sep, 1)[0]
    return first if first in PROTECTED else None


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def bwrap_argv(mode: str, network: bool, workspace: Path, state_dir: Path, cwd: Path, *,
               bwrap: str = "bwrap", seccomp: int | None = None) -> list[str]:
    """The bubblewrap prefix for one command (empty for danger-full-access). Paths should be resolved."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; choose from: {', '.join(MODES)}")
    if mode == UNSANDBOXED:
        return []
    ws, state = str(workspace), str(state_dir)
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    hide_state = ["--tmpfs", state]
    if _under(workspace, state_dir):  # a workspace inside the state directory: cover first, then bind into it
        argv += hide_state
        hide_state = []
    else:
        hide_state += ["--remount-ro", state]
    # the workspace again after the /tmp tmpfs (it may live under /tmp): writable, or read-only
    argv += ["--bind" if mode == "workspace-write" else "--ro-bind", ws, ws]
    if mode == "workspace-write":
        for name in PROTECTED:
            inner = workspace / name
            if inner.exists() or inner.is_symlink():
                argv += ["--ro-bind", str(inner), str(inner)]
    argv += hide_state
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        argv.append("--unshare-net")
    if seccomp is not None:
        argv += ["--seccomp", str(seccomp)]
    argv += ["--die-with-parent", "--new-session", "--chdir", str(cwd), "--"]
    return argv


def command_argv(shell: str, cmd: str, *, mode: str, network: bool, workspace: Path | None, state_dir: Path,
                 cwd: Path, limits: Limits, bwrap: str | None, prlimit: str | None,
                 seccomp: int | None = None, platform: str | None = None, job_tmpdir: Path | None = None,
                 sandbox_exec: str = SANDBOX_EXEC) -> list[str]:
    """The whole argv of one exec_command: [bwrap …] [prlimit …] shell -c cmd on Linux;
    [sandbox-exec -p PROFILE …] [sh -c 'ulimit …'] shell -c cmd on macOS (`job_tmpdir`: its writable TMPDIR)."""
    argv: list[str] = []
    if backend_for(platform or sys.platform) == "seatbelt":
        if mode != UNSANDBOXED:
            if workspace is None or job_tmpdir is None:
                raise ValueError("a sandboxed mode needs a workspace and a private TMPDIR")
            argv += seatbelt_argv(mode, network, workspace, state_dir, job_tmpdir,
                                  [workspace / name for name in PROTECTED], sandbox_exec=sandbox_exec)
        return [*argv, *limits_argv(limits.cpu_seconds, limits.address_space_mb), shell, "-c", cmd]
    if mode != UNSANDBOXED:
        if bwrap is None or workspace is None:
            raise ValueError("a sandboxed mode needs bubblewrap and a workspace")
        argv += bwrap_argv(mode, network, workspace, state_dir, cwd, bwrap=bwrap, seccomp=seccomp)
    if prlimit is not None:
        argv += limits.argv(prlimit)
    return [*argv, shell, "-c", cmd]


PIDS_CGROUP = Path("/sys/fs/cgroup/pids")  # the cgroup v1 pids hierarchy, where ctproxy may make one per job


def pids_cgroup(root: Path = PIDS_CGROUP) -> Path | None:
    """A pids cgroup hierarchy ctproxy may write (root, or a delegated one): each job then gets its own
    `pids.max`, which holds for root too (RLIMIT_NPROC does not). None when there is none."""
    if (root / "cgroup.procs").exists() and os.access(root, os.W_OK):
        return root
    return None


def join_cgroup_argv(cgroup: Path, limits: Limits | None = None) -> list[str]:
    """A prefix that moves the job into `cgroup` before anything of it runs, and sets the CPU and address-space
    limits there (one `exec` fewer than prlimit: the cgroup bounds the processes); if a step fails nothing runs."""
    script = 'echo $$ > "$0/cgroup.procs"'
    if limits is not None and limits.cpu_seconds:
        script += f" && ulimit -t {limits.cpu_seconds}"
    if limits is not None and limits.address_space_mb:
        script += f" && ulimit -v {limits.address_space_mb * 1024}"
    return ["/bin/sh", "-c", script + ' && exec "$@"', str(cgroup)]


def find_bwrap(path: str | None = None) -> str | None:
    return shutil.which("bwrap", path=path)


def find_prlimit(path: str | None = None) -> str | None:
    return shutil.which("prlimit", path=path)


@functools.lru_cache(maxsize=8)
def _probe(bwrap: str) -> str | None:
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net",
            "--die-with-parent", "--new-session", "--", "true"]
    try:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({bwrap}) cannot run: {type(exc).__name__}"
    if out.returncode != 0:
        said = out.stderr.decode("utf-8", "replace").strip().splitlines()
        return (f"bubblewrap ({bwrap}) cannot create the sandbox's namespaces here: "
                f"{said[-1][:200] if said else f'exit {out.returncode}'}")
    return None


def sandbox_problem(mode: str, path: str | None = None, platform: str | None = None) -> str | None:
    """Why the configured sandbox cannot run here (every command would be refused), or None."""
    if mode == UNSANDBOXED:
        return None
    platform = platform or sys.platform
    backend = backend_for(platform)
    if backend == "seatbelt":
        if (problem := seatbelt_check()) is None:
            return None
        return (f"shell.sandbox {mode} on macOS: {problem}; ctproxy up --sandbox danger-full-access runs "
                "unsandboxed")
    if backend is None:
        return (f"shell.sandbox {mode}: no sandbox on {platform}; "
                "ctproxy up --sandbox danger-full-access runs unsandboxed")
    bwrap = find_bwrap(path)
    if bwrap is None:
        return (f"shell.sandbox {mode} needs bubblewrap (bwrap), which is not on PATH (Debian package bubblewrap; "
                "scripts/bootstrap.sh installs it), or ctproxy up --sandbox danger-full-access to run unsandboxed")
    return _probe(bwrap)


@functools.lru_cache(maxsize=1)
def seatbelt_check() -> str | None:
    """macOS, once per process: sandbox-exec is there, and a probe command ran under the profile. None when
    both held (what `describe` then says was checked); else the reason the sandboxed modes are unavailable."""
    return seatbelt_problem() or seatbelt_probe()


SEATBELT_CHECKED = f"Seatbelt; checked: {SANDBOX_EXEC} is present and a probe command ran under the profile"


def _describe_seatbelt(mode: str, network: bool, limits: Limits) -> str:
    head = "unsandboxed (danger-full-access)" if mode == UNSANDBOXED else (
        f"sandbox {mode}, network {'on' if network else 'off'} ({SEATBELT_CHECKED})")
    parts = []
    if limits.cpu_seconds:
        parts.append(f"cpu {limits.cpu_seconds} s")
    if limits.address_space_mb:
        parts.append(f"address space {limits.address_space_mb} MiB")
    said = f"{head}; per-job limits (ulimit): {', '.join(parts) if parts else 'none'}"
    if limits.processes:
        said += f"; the {limits.processes}-process limit is not enforced on macOS (no per-job process count there)"
    return said


def describe(mode: str, network: bool, limits: Limits, prlimit: str | None, root: bool | None = None,
             cgroup: Path | None = None, seccomp: bool | None = None, platform: str | None = None) -> str:
    """The status words: `sandbox workspace-write, network off` or `unsandboxed`, then the limits. Called for an
    active shell only (a sandbox that cannot run makes the shell `unavailable` with `sandbox_problem`'s reason)."""
    if backend_for(platform or sys.platform) == "seatbelt":
        return _describe_seatbelt(mode, network, limits)
    if seccomp is None:
        seccomp = seccomp_program() is not None
    filt = f"seccomp denies {len(SECCOMP_DENIED_X86_64)} system calls" if seccomp else "no seccomp filter on this CPU"
    head = "unsandboxed (danger-full-access)" if mode == UNSANDBOXED else (
        f"sandbox {mode}, network {'on' if network else 'off'} (bubblewrap; {filt})")
    if prlimit is None and cgroup is None:
        return f"{head}; no per-job limits (prlimit is not on PATH, and no pids cgroup is writable)"
    parts = []
    if limits.cpu_seconds:
        parts.append(f"cpu {limits.cpu_seconds} s")
    if limits.address_space_mb:
        parts.append(f"address space {limits.address_space_mb} MiB")
    if limits.processes:
        root = os.geteuid() == 0 if root is None else root
        if cgroup is not None:
            parts.append(f"{limits.processes} processes (a pids cgroup per job)")
        else:
            parts.append(f"{limits.processes} processes" + (" (not enforced: the kernel exempts root)" if root else ""))
    return f"{head}; per-job limits: {', '.join(parts) if parts else 'none'}"


# -- seccomp (x86_64 only): a BPF program bubblewrap installs before the command (`--seccomp FD`) ---------------
# System calls a sandboxed command has no business making, refused with EPERM (after Docker's default profile):
# tracing other processes, mounting, namespaces, kernel modules and keys, kexec, BPF, perf, userfaultfd,
# io_uring, file handles. clone()'s namespace flags are not inspected (clone3 takes them in memory).
SECCOMP_DENIED_X86_64: dict[str, int] = {
    "ptrace": 101, "pivot_root": 155, "chroot": 161, "acct": 163, "mount": 165, "umount2": 166, "swapon": 167,
    "swapoff": 168, "reboot": 169, "init_module": 175, "delete_module": 176, "kexec_load": 246, "add_key": 248,
    "request_key": 249, "keyctl": 250, "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425,
    "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
}
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
_RET_ALLOW, _RET_KILL_PROCESS, _RET_EPERM = 0x7FFF0000, 0x80000000, 0x00050000 | 1
_LD_ABS, _JEQ, _JGE, _RET = 0x20, 0x15, 0x35, 0x06


def seccomp_program(machine: str | None = None) -> bytes | None:
    """The BPF program (struct sock_filter[]) for this machine, or None where ctproxy has none (not x86_64)."""
    import platform
    import struct

    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return None
    numbers = sorted(SECCOMP_DENIED_X86_64.values())
    n = len(numbers)
    deny = 6 + n  # index of the EPERM return
    prog = [(_LD_ABS, 0, 0, 4), (_JEQ, 1, 0, _AUDIT_ARCH_X86_64), (_RET, 0, 0, _RET_KILL_PROCESS),
            (_LD_ABS, 0, 0, 0), (_JGE, deny - 5, 0, _X32_BIT)]
    for i, nr in enumerate(numbers):
        prog.append((_JEQ, deny - (5 + i + 1), 0, nr))
    prog += [(_RET, 0, 0, _RET_ALLOW), (_RET, 0, 0, _RET_EPERM)]
    return b"".join(struct.pack("=HBBI", *ins) for ins in prog)


def seccomp_fd(program: bytes) -> int:
    """A fresh readable fd holding `program` (bubblewrap reads it to the end): one per spawn, closed by the caller
    once the child has it."""
    fd = os.memfd_create("ctproxy-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
