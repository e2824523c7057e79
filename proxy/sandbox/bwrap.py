"""The shell sandbox (issue 33): bubblewrap argv, per-job limits, and the one probe of this machine.

Pure functions plus one cached probe, shared by `ctproxy status` (proxy/app/status.py) and the tool server's
spawn (tools_server/shell/manager.py), so what status says is what the spawn does. On macOS the same modes
wrap commands with `sandbox-exec` and a Seatbelt profile instead (proxy/sandbox/seatbelt.py), after its own probe.

Modes, named as Codex names them:
- `workspace-write` (default): the filesystem is read-only except the workspace and a private /tmp (tmpfs);
  the workspace's `.git` is re-bound read-only; ctproxy's state directory is covered by an empty read-only
  tmpfs; the directories where Unix sockets live (`socket_dirs`: /run, $XDG_RUNTIME_DIR, $HOME/.cache, the
  D-Bus addresses' directories; /tmp with the X socket is private already) are covered by empty private tmpfs; a
  new network namespace unless `shell.network` (which also cuts off abstract Unix sockets); a new pid namespace,
  the sandbox dies with its job (`--die-with-parent`) and runs in a new session (`--new-session`, no terminal
  injection).
- `read-only`: the same, with the workspace read-only too: only the private /tmp is writable.
- `danger-full-access`: no sandbox (the behaviour before issue 33).

Capabilities: a new user namespace where the kernel allows one (`--unshare-user-try`) and `--cap-drop ALL`, so
the command has no capability (CapEff, CapPrm and the bounding set all zero), also when ctproxy runs as root
(without `--cap-drop`, bubblewrap run by root keeps root's full set: seed004 N1); bubblewrap sets no_new_privs.
A seccomp filter built with libseccomp (`seccomp_program`, through the pyseccomp bindings) refuses what a command
has no business doing: fanotify, ptrace, mount, namespaces (unshare, setns, clone with CLONE_NEW*; clone3 says
ENOSYS so libc falls back to clone, whose flags the filter reads), modules, keys, BPF, perf, io_uring, file
handles … with EPERM; without libseccomp the sandboxed modes are unavailable, and status says why.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from proxy.sandbox.seatbelt import (
    SANDBOX_EXEC,
    backend_for,
    limits_argv,
    seatbelt_argv,
    seatbelt_probe,
    seatbelt_problem,
)

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


# Where Unix sockets of the host live, covered by empty private tmpfs inside the sandbox (seed004 N2): a read-only
# bind does not stop connect(). /tmp (the X socket dir, ssh-agent's) is private already; /var/run is /run.
SOCKET_DIRS = ("/run", "/var/run")
_BUS_VARS = ("DBUS_SESSION_BUS_ADDRESS", "DBUS_SYSTEM_BUS_ADDRESS", "AT_SPI_BUS_ADDRESS")


def socket_dirs(env: Mapping[str, str]) -> list[Path]:
    """The existing directories to hide for this environment, resolved, without duplicates or nesting:
    /run, $XDG_RUNTIME_DIR, $HOME/.cache (the AT-SPI bus of Computer Use's desktop), and the directory of every
    `unix:path=` in the D-Bus addresses."""
    found = [*SOCKET_DIRS]
    if env.get("XDG_RUNTIME_DIR"):
        found.append(env["XDG_RUNTIME_DIR"])
    if env.get("HOME"):
        found.append(os.path.join(env["HOME"], ".cache"))
    for var in _BUS_VARS:
        for address in env.get(var, "").split(";"):
            for part in address.partition(":")[2].split(","):
                key, _, value = part.partition("=")
                if key == "path" and value.startswith("/"):
                    found.append(os.path.dirname(value))
    dirs: list[Path] = []
    for raw in found:
        path = Path(raw).resolve()
        if path.is_dir() and path != Path("/") and path not in dirs:
            dirs.append(path)
    return [d for d in dirs if not any(o != d and _under(d, o) for o in dirs)]  # /run/user/0 is inside /run


def bwrap_argv(mode: str, network: bool, workspace: Path, state_dir: Path, cwd: Path, *,
               bwrap: str = "bwrap", seccomp: int | None = None, hide: Sequence[Path] = ()) -> list[str]:
    """The bubblewrap prefix for one command (empty for danger-full-access). Paths should be resolved; `hide`:
    directories covered by an empty private tmpfs (`socket_dirs`)."""
    if mode not in MODES:
        raise ValueError(f"unknown sandbox mode {mode!r}; choose from: {', '.join(MODES)}")
    if mode == UNSANDBOXED:
        return []
    ws, state = str(workspace), str(state_dir)
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    # a hidden directory that holds the workspace is covered first, then the workspace bound into it; the others
    # (one inside a writable workspace too) are covered after the workspace
    before = [d for d in hide if _under(workspace, d)]
    after = [d for d in hide if d not in before]
    for d in before:
        argv += ["--tmpfs", str(d)]
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
    for d in after:
        argv += ["--tmpfs", str(d)]
    argv += hide_state
    if network:  # a resolv.conf that points into /run (systemd-resolved) stays readable
        resolv = Path("/etc/resolv.conf").resolve()
        if resolv.is_file() and any(_under(resolv, d) for d in hide):
            argv += ["--ro-bind", str(resolv), str(resolv)]
    # no capability, also for root (seed004 N1): a user namespace where allowed, and the whole set dropped
    argv += ["--unshare-user-try", "--cap-drop", "ALL"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not network:
        argv.append("--unshare-net")
    if seccomp is not None:
        argv += ["--seccomp", str(seccomp)]
    argv += ["--die-with-parent", "--new-session", "--chdir", str(cwd), "--"]
    return argv


# Inside bubblewrap's pid namespace everything dies when the command does (its init exits with it). So a keeper
# shell starts the command, waits for it, then until no other live process of its process group is left (the
# job's `cmd &` children, as unsandboxed: seed §5.6, seed004 N4), reading the namespace's few /proc/N/stat with
# builtins only (pid 1 is bubblewrap's init, in the same group), and exits with the command's status. The command
# keeps the job's stdin (an asynchronous list would get /dev/null).
KEEP_GROUP = ('exec 3<&0 </dev/null; "$@" <&3 3<&- & p=$!; exec 3<&-; wait "$p"; r=$?; '
              'read -r s < /proc/$$/stat; s=${s##*) }; set -- $s; g=$3; '
              'while :; do a=; for f in /proc/[0-9]*/stat; do '
              'case $f in /proc/1/stat|/proc/$$/stat) continue;; esac; '
              'read -r s 2>/dev/null < "$f" || continue; s=${s##*) }; set -- $s; '
              '[ "$1" != Z ] && [ "$3" = "$g" ] && a=1 && break; done; '
              '[ -z "$a" ] && exit "$r"; sleep 0.05; done')


def keep_group_argv() -> list[str]:
    """The keeper's prefix: POSIX sh, nothing else."""
    return ["/bin/sh", "-c", KEEP_GROUP, "sh"]


def command_argv(shell: str, cmd: str, *, mode: str, network: bool, workspace: Path | None, state_dir: Path,
                 cwd: Path, limits: Limits, bwrap: str | None, prlimit: str | None,
                 seccomp: int | None = None, platform: str | None = None, job_tmpdir: Path | None = None,
                 sandbox_exec: str = SANDBOX_EXEC, hide: Sequence[Path] = (),
                 keep_group: bool = False) -> list[str]:
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
        argv += bwrap_argv(mode, network, workspace, state_dir, cwd, bwrap=bwrap, seccomp=seccomp, hide=hide)
    if prlimit is not None:
        argv += limits.argv(prlimit)
    if mode != UNSANDBOXED and keep_group:
        argv += keep_group_argv()
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
    argv = [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--tmpfs", "/run",
            "--unshare-user-try", "--cap-drop", "ALL", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--unshare-net",
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
    return seccomp_problem() or _probe(bwrap)


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
    filt = (f"no capabilities; seccomp denies {len(SECCOMP_DENIED)} system calls and namespace creation"
            if seccomp else "no capabilities; no seccomp filter")
    head = "unsandboxed (danger-full-access)" if mode == UNSANDBOXED else (
        f"sandbox {mode}, network {'on' if network else 'off'} (bubblewrap; {filt}; socket directories hidden)")
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


# -- seccomp: a BPF program bubblewrap installs before the command (`--seccomp FD`), built by libseccomp -------------
# System calls a sandboxed command has no business making, refused with EPERM (after Docker's default profile and
# Codex's Linux sandbox): watching or tracing other processes, mounting, namespaces, kernel modules and keys,
# kexec, BPF, perf, userfaultfd, io_uring, file handles, the clock, the kernel log. Names, not numbers: libseccomp
# maps them for the machine's CPU (and skips one this CPU does not have).
SECCOMP_DENIED: tuple[str, ...] = (
    "fanotify_init", "fanotify_mark", "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "process_madvise", "mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "mount_setattr", "unshare", "setns", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "name_to_handle_at", "open_by_handle_at", "acct",
    "swapon", "swapoff", "reboot", "quotactl", "quotactl_fd", "lookup_dcookie", "syslog", "vhangup", "iopl", "ioperm",
    "settimeofday", "clock_settime", "clock_adjtime", "uselib", "nfsservctl",
)
# clone() with any of these flags makes a namespace: refused. clone3 passes its flags in memory, which a filter
# cannot read, so it answers ENOSYS and libc falls back to clone.
CLONE_NEW_FLAGS = {"CLONE_NEWTIME": 0x80, "CLONE_NEWNS": 0x20000, "CLONE_NEWCGROUP": 0x02000000,
                   "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000,
                   "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000}
_EPERM, _ENOSYS = 1, 38


def seccomp_problem() -> str | None:
    """Why ctproxy cannot build its filter here (libseccomp or its bindings missing), or None."""
    try:
        import pyseccomp  # noqa: F401  (loads libseccomp.so.2 on import)
    except (ImportError, OSError, AttributeError, TypeError) as exc:
        return (f"the seccomp filter needs libseccomp (Debian package libseccomp2) and its bindings (pyseccomp): "
                f"{type(exc).__name__}: {str(exc)[:160]}")
    return None


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes | None:
    """The BPF program (struct sock_filter[]) for this machine's CPU, or None where libseccomp cannot be loaded
    (then `sandbox_problem` refuses the sandboxed modes). Other CPU conventions (x32, i386 on x86_64) are killed."""
    if seccomp_problem() is not None:
        return None
    import pyseccomp as sc

    filt = sc.SyscallFilter(sc.ALLOW)
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    for name in SECCOMP_DENIED:
        try:
            filt.add_rule(sc.ERRNO(_EPERM), name)
        except OSError:  # no such system call on this CPU (iopl on arm64): nothing to refuse
            continue
    filt.add_rule(sc.ERRNO(_ENOSYS), "clone3")
    for flag in CLONE_NEW_FLAGS.values():  # the rules of one system call are OR-ed
        filt.add_rule(sc.ERRNO(_EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    fd = os.memfd_create("ctproxy-seccomp-build", 0)
    try:
        with os.fdopen(os.dup(fd), "wb") as out:
            filt.export_bpf(out)
        size = os.lseek(fd, 0, os.SEEK_END)
        return os.pread(fd, size, 0)
    finally:
        os.close(fd)


def seccomp_fd(program: bytes) -> int:
    """A fresh readable fd holding `program` (bubblewrap reads it to the end): one per spawn, closed by the caller
    once the child has it."""
    fd = os.memfd_create("ctproxy-seccomp", 0)
    os.write(fd, program)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
