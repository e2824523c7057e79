"""The shell sandbox confines as root and as a normal user (seed004 N1, N2), with a real bubblewrap.

As root (this machine, CI): the tool server runs the command; the probe reads its capabilities, tries fanotify
(the road by which a root sandbox read the state directory's token and wrote outside the workspace), and tries
Unix sockets bound outside the workspace. As a normal user: the same launch argv the tool server builds, run
under `setpriv` as `nobody`. Each waits on conditions with generous bounds, never on wall-clock figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.sandbox.bwrap import sandbox_problem, seccomp_fd, socket_dirs
from tests.support.optional import skip_reason

pytestmark = pytest.mark.timeout(180)
ON = {"shell.enabled": True, "shell.sandbox": "workspace-write"}
AGENT = {"task": "t", "agent": "/root"}
NOBODY = 65534

# Reads the capability lines, then tries fanotify_init (read-only and read-write listeners) and, where one was
# granted, marks the whole filesystem and reports a host open of `argv[2]` (the state directory's token).
FAN = r"""
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
for line in open("/proc/self/status"):
    if line.startswith(("CapEff", "CapPrm", "CapBnd", "NoNewPrivs", "Seccomp:")):
        print(line.split()[0], line.split()[1], flush=True)
rw = libc.fanotify_init(0x0, os.O_RDWR)
print("fanotify_rw", rw, ctypes.get_errno(), flush=True)
if rw >= 0:
    os.close(rw)  # never marked: an O_RDWR listener would stall every exec on the machine
fd = libc.fanotify_init(0x2, os.O_RDONLY)
print("fanotify_init", fd, ctypes.get_errno(), flush=True)
if fd >= 0:
    print("mark", libc.fanotify_mark(fd, 0x1 | 0x100, ctypes.c_uint64(0x20), -100, os.getcwd().encode()), flush=True)
    end = time.time() + float(sys.argv[1])
    while time.time() < end:
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        off = 0
        while off + 24 <= len(buf):
            ln, _v, _r, _m, _mask, efd, _pid = struct.unpack_from("=IBBHQii", buf, off)
            off += ln
            if efd < 0:
                continue
            path = os.readlink(f"/proc/self/fd/{efd}")
            if path == sys.argv[2]:
                print("OPENED BY THE HOST", os.pread(efd, 4, 0), flush=True)
                end = 0
            os.close(efd)
print("probe done", flush=True)
"""

# Connects to each Unix socket address given (a path, or @name for an abstract one) and prints what it read.
CONNECT = r"""
import socket, sys
for where in sys.argv[1:]:
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    try:
        s.connect("\0" + where[1:] if where.startswith("@") else where)
        print("REACHED", where, s.recv(16).decode().strip(), flush=True)
    except OSError as exc:
        print("refused", where, exc.errno, flush=True)
"""


@pytest.fixture
def bwrap() -> None:
    if sandbox_problem("workspace-write") is not None:
        pytest.skip(skip_reason("sandbox", "bubblewrap (a working bwrap) and libseccomp"))


@pytest.fixture
def outside_tmp() -> Iterator[Path]:
    """A directory outside /tmp (the sandbox's /tmp is private already, so a socket there proves nothing)."""
    base = Path(tempfile.mkdtemp(prefix="ctp-confine-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def workspace(root: Path) -> Path:
    ws = root / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    (ws / "fan.py").write_text(FAN)
    (ws / "connect.py").write_text(CONNECT)
    return ws


def field(out: str, name: str) -> list[str]:
    return next((line.split()[1:] for line in out.splitlines() if line.split()[:1] == [name]), [])


@contextlib.contextmanager
def unix_servers(paths: list[Path], abstract: str) -> Iterator[list[str]]:
    """Listening sockets that answer `hello` (threads, so a synchronous subprocess test can use them too)."""
    import threading

    socks = []
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        os.chmod(path, 0o777)
        socks.append(s)
    s = socket.socket(socket.AF_UNIX)
    s.bind("\0" + abstract)
    socks.append(s)
    stop = threading.Event()

    def serve(sock: socket.socket) -> None:
        sock.listen(4)
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.sendall(b"hello\n")

    threads = [threading.Thread(target=serve, args=(s,), daemon=True) for s in socks]
    for t in threads:
        t.start()
    try:
        yield [*(str(p) for p in paths), "@" + abstract]
    finally:
        stop.set()
        for t in threads:
            t.join(5)
        for s in socks:
            s.close()


async def test_as_root_no_capability_no_fanotify_and_the_token_stays_hidden(
        bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("this test is about a tool server run by root; the unprivileged one is below")
    ws = workspace(tmp_path)
    srv = await tool_server(ON, workspace=ws)
    token_path = srv.services.state.root / "token"
    first = await srv.rest("exec_command", {"cmd": f"python3 fan.py 8 {token_path}", "yield_time_ms": 1500}, **AGENT)
    assert first.ok, first.body
    out = first.details["stdout"]["text"]
    for _ in range(80):  # the host keeps opening the token, as any reader of it would, until the probe ends
        token_path.read_bytes()
        if "probe done" in out:
            break
        if "session_id" not in first.details:
            break
        nxt = await srv.rest("write_stdin", {"session_id": first.details["session_id"], "yield_time_ms": 250}, **AGENT)
        out += nxt.details["stdout"]["text"]
        if "session_id" not in nxt.details:
            break
    assert "OPENED BY THE HOST" not in out, out
    assert field(out, "CapEff:") == ["0000000000000000"] and field(out, "CapPrm:") == ["0000000000000000"], out
    assert field(out, "CapBnd:") == ["0000000000000000"] and field(out, "NoNewPrivs:") == ["1"], out
    assert field(out, "Seccomp:") == ["2"], out
    assert field(out, "fanotify_init")[0] == "-1" and field(out, "fanotify_rw")[0] == "-1", out
    assert field(out, "fanotify_init")[1] == "1", out  # EPERM: the filter's answer (no capability would say it too)


async def test_root_sandbox_cannot_change_outside_or_git_or_read_the_token(
        bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "canary").write_text("host\n")
    srv = await tool_server(ON, workspace=ws)
    state = srv.services.state.root
    cmd = (f"echo x > {outside}/canary; echo y >> .git/config; chmod 777 .git/config; "
           f"mount -t tmpfs none {outside}; cat {state}/token; echo end")
    res = await srv.rest("exec_command", {"cmd": cmd, "yield_time_ms": 30000}, **AGENT)
    assert res.ok and res.details["stdout"]["text"] == "end\n", res.body
    assert (outside / "canary").read_text() == "host\n"
    assert (ws / ".git" / "config").read_text() == "[core]\n\tbare = false\n"
    assert (ws / ".git" / "config").stat().st_mode & 0o777 != 0o777


async def test_sockets_outside_the_workspace_cannot_be_reached(
        bwrap: None, tool_server: Any, tmp_path: Path, outside_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path socket in each hidden place ($XDG_RUNTIME_DIR, $HOME/.cache where Computer Use's AT-SPI bus lives,
    a D-Bus address's directory) and an abstract one; one in the workspace stays reachable (the probe works)."""
    home, runtime, bus = outside_tmp / "home", outside_tmp / "runtime", outside_tmp / "bus"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={bus}/session,guid=0")
    ws = workspace(outside_tmp)
    abstract = f"ctp-abstract-{uuid.uuid4().hex}"
    paths = [home / ".cache" / "at-spi" / "bus_0", runtime / "bus", bus / "session", ws / "inside.sock"]
    with unix_servers(paths, abstract) as where:
        srv = await tool_server(ON, workspace=ws)  # the shell captures the environment now
        res = await srv.rest("exec_command", {"cmd": "python3 connect.py " + " ".join(where),
                                              "yield_time_ms": 30000}, **AGENT)
    out = res.details["stdout"]["text"]
    assert f"REACHED {ws / 'inside.sock'} hello" in out, out
    assert out.count("REACHED") == 1 and out.count("refused") == 4, out


def test_as_a_normal_user_the_same_launch_confines(bwrap: None, outside_tmp: Path, tmp_path: Path) -> None:
    """The launch argv the tool server builds (`ShellManager._argv`), run as `nobody` under setpriv: a tool
    server started by a normal user. bubblewrap then needs an unprivileged user namespace."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("switching to nobody needs root and setpriv (util-linux)")
    from proxy.sandbox.bwrap import Limits
    from tools_server.shell.capture import CaptureStore
    from tools_server.shell.manager import Confinement, ShellManager

    ws, outside, state = workspace(outside_tmp), outside_tmp / "outside", outside_tmp / "state"
    outside.mkdir()
    state.mkdir(mode=0o700)
    (outside / "canary").write_text("host\n")
    (state / "token").write_text("ctp_secret\n")
    home = outside_tmp / "home"
    for path in [ws, *ws.rglob("*"), outside, outside / "canary", state, state / "token"]:
        os.chown(path, NOBODY, NOBODY)
    abstract = f"ctp-abstract-{uuid.uuid4().hex}"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home)}  # the system python3: nobody may not read the venv's
    box = Confinement("workspace-write", False, ws.resolve(), state.resolve(), Limits())
    manager = ShellManager(CaptureStore(tmp_path / "cap"), shell="/bin/sh", env=env, confinement=box)
    cmd = (f"python3 fan.py 0 none; echo x > {outside}/canary; echo y >> .git/config; cat {state}/token; "
           f"python3 connect.py {home}/.cache/at-spi/bus_0 @{abstract}; echo end")
    fd = seccomp_fd(manager._seccomp) if manager._seccomp is not None else None
    with unix_servers([home / ".cache" / "at-spi" / "bus_0"], abstract):
        assert (home / ".cache").resolve() in socket_dirs(env)
        argv = asyncio.run(manager._argv("exec_command", cmd, ws, fd, env=env))
        try:
            done = subprocess.run([setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv],
                                  cwd=ws, env=env, capture_output=True, text=True, timeout=120,
                                  pass_fds=(fd,) if fd is not None else ())
        finally:
            if fd is not None:
                os.close(fd)
    out = done.stdout
    if "No permissions to create new namespace" in done.stderr or "setting up uid map" in done.stderr:
        pytest.skip(f"this kernel refuses an unprivileged user namespace: {done.stderr.strip()[:200]}")
    assert done.returncode == 0 and out.endswith("end\n"), (out, done.stderr)
    assert field(out, "CapEff:") == ["0000000000000000"] and field(out, "NoNewPrivs:") == ["1"], out
    assert field(out, "fanotify_init")[0] == "-1", out
    assert (outside / "canary").read_text() == "host\n" and "y" not in (ws / ".git" / "config").read_text()
    assert "ctp_secret" not in out and "REACHED" not in out and out.count("refused") == 2, out


async def test_background_children_keep_the_job_running_and_their_output(
        bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    """seed004 N4: a `cmd &` child in the sandbox outlives the command as unsandboxed (the job runs until the
    group is gone); stdin still reaches the command."""
    srv = await tool_server(ON, workspace=workspace(tmp_path))
    first = await srv.rest("exec_command", {"cmd": "(sleep 1; echo CHILD-DONE) & read line; echo started $line",
                                            "yield_time_ms": 250}, **AGENT)
    assert first.ok and "session_id" in first.details, first.body  # still running: the child is the job's
    out = first.details["stdout"]["text"]
    nxt = await srv.rest("write_stdin", {"session_id": first.details["session_id"], "chars": "fed\n",
                                         "yield_time_ms": 30000}, **AGENT)
    out += nxt.details["stdout"]["text"]
    for _ in range(60):
        if "session_id" not in nxt.details:
            break
        nxt = await srv.rest("write_stdin", {"session_id": first.details["session_id"], "yield_time_ms": 1000},
                             **AGENT)
        out += nxt.details["stdout"]["text"]
    assert out == "started fed\nCHILD-DONE\n" and nxt.details["exit_code"] == 0, (out, nxt.body)
    res = await srv.rest("exec_command", {"cmd": "sh -c 'kill -9 $$'", "yield_time_ms": 30000}, **AGENT)
    assert res.details["exit_code"] == 128 + 9  # the command's own status comes through the keeper


def test_the_cgroups_of_a_dead_tool_server_are_removed(tmp_path: Path) -> None:
    """seed004 N12: a tool server killed before its close left its jobs' empty pids cgroups for good; the
    next one removes those of servers that are gone, and never a live server's."""
    from proxy.sandbox.bwrap import pids_cgroup
    from tools_server.shell.manager import sweep_dead_cgroups

    root = pids_cgroup()
    if root is None:
        pytest.skip("no writable pids cgroup hierarchy here")
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that is gone now
    stale, live = root / f"ctproxy-{dead.pid}-1234", root / f"ctproxy-{os.getppid()}-5678"
    stale.mkdir()
    live.mkdir()
    try:
        assert sweep_dead_cgroups(root) >= 1
        assert not stale.exists() and live.exists()
    finally:
        for path in (stale, live):
            with contextlib.suppress(OSError):
                path.rmdir()


def test_socket_dirs_and_their_place_in_the_argv(tmp_path: Path) -> None:
    """The hidden directories (pure): found from the environment, nested ones dropped; one that holds the
    workspace is covered before the workspace is bound into it, the others after (also one inside it)."""
    from proxy.sandbox.bwrap import bwrap_argv

    home, run_user = tmp_path / "home", tmp_path / "run" / "user" / "0"
    (home / ".cache" / "at-spi").mkdir(parents=True)
    run_user.mkdir(parents=True)
    bus = tmp_path / "bus"
    bus.mkdir()
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": str(run_user),
           "DBUS_SESSION_BUS_ADDRESS": f"unix:path={bus}/s,guid=1;unix:abstract=/tmp/x",
           "AT_SPI_BUS_ADDRESS": f"unix:path={home}/.cache/at-spi/bus_0"}
    found = socket_dirs(env)
    assert (home / ".cache").resolve() in found and run_user.resolve() in found and bus.resolve() in found
    assert (home / ".cache" / "at-spi").resolve() not in found  # inside $HOME/.cache: covered already
    ws, state = (home / ".cache" / "proj").resolve(), (tmp_path / "state").resolve()
    text = " ".join(bwrap_argv("workspace-write", False, ws, state, ws, hide=found))
    assert text.index(f"--tmpfs {home.resolve()}/.cache") < text.index(f"--bind {ws} {ws}")
    assert text.index(f"--bind {ws} {ws}") < text.index(f"--tmpfs {bus.resolve()}")
    inside = bwrap_argv("workspace-write", False, home.resolve(), state, home.resolve(), hide=found)
    joined = " ".join(inside)
    assert joined.index(f"--bind {home.resolve()} ") < joined.index(f"--tmpfs {home.resolve()}/.cache")
