"""The shell sandbox (issue 33) with a real bubblewrap, through the tool server's REST and MCP.

Every test that needs bubblewrap skips with the set-up's reason when it is missing (`sandbox` in
.venv/ctproxy-setup.json). Nothing here waits on wall-clock figures: conditions are polled with generous bounds.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import psutil
import pytest

from proxy.app.status import capability_status
from proxy.config import Config
from proxy.sandbox.bwrap import Limits, bwrap_argv, command_argv, describe, pids_cgroup, protected_part, sandbox_problem
from tests.support.optional import skip_reason

pytestmark = pytest.mark.timeout(180)

# explicit: the suite may default to unsandboxed where bwrap is missing (tests/support/sandbox.py)
ON = {"shell.enabled": True, "shell.sandbox": "workspace-write"}
AGENT = {"task": "t", "agent": "/root"}


@pytest.fixture
def bwrap() -> None:
    if sandbox_problem("workspace-write") is not None:
        pytest.skip(skip_reason("sandbox", "bubblewrap (a working bwrap)"))


def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / ".git" / "config").write_text("[core]\n\tbare = false\n")
    return ws


async def run(srv: Any, cmd: str, **kw: Any) -> Any:
    res = await srv.rest("exec_command", {"cmd": cmd, "yield_time_ms": 30000, **kw}, **AGENT)
    assert res.status == 200, res.body
    return res


# -- the pure argv ------------------------------------------------------------------------------------------
def test_the_argv_of_each_mode(tmp_path: Path) -> None:
    ws, state = workspace(tmp_path), tmp_path / "state"
    argv = bwrap_argv("workspace-write", False, ws, state, ws, bwrap="/usr/bin/bwrap")
    text = " ".join(argv)
    assert argv[:5] == ["/usr/bin/bwrap", "--ro-bind", "/", "/", "--dev"]
    assert f"--bind {ws} {ws}" in text and f"--ro-bind {ws}/.git {ws}/.git" in text
    assert f"--tmpfs {state} --remount-ro {state}" in text
    assert text.index("--tmpfs /tmp") < text.index(f"--bind {ws}")  # a workspace under /tmp stays visible
    assert "--unshare-net" in argv and "--unshare-pid" in argv and "--die-with-parent" in argv
    assert "--new-session" in argv and argv[-1] == "--"
    assert "--unshare-user-try" in argv and "--cap-drop ALL" in text  # no capability, also as root (seed004 N1)
    assert "--unshare-net" not in bwrap_argv("workspace-write", True, ws, state, ws)
    (ws / ".codex").mkdir()  # Codex's other protected names, when they exist
    assert f"--ro-bind {ws}/.codex {ws}/.codex" in " ".join(bwrap_argv("workspace-write", False, ws, state, ws))
    assert ".agents" not in " ".join(bwrap_argv("workspace-write", False, ws, state, ws))
    ro = " ".join(bwrap_argv("read-only", False, ws, state, ws))
    assert f"--ro-bind {ws} {ws}" in ro and f"--bind {ws}" not in ro
    assert bwrap_argv("danger-full-access", False, ws, state, ws) == []
    inner = tmp_path / "state" / "ws"  # a workspace inside the state directory: covered first, then bound
    nested = " ".join(bwrap_argv("workspace-write", False, inner, state, inner))
    assert nested.index(f"--tmpfs {state}") < nested.index(f"--bind {inner}") and "--remount-ro" not in nested
    full = command_argv("/bin/sh", "true", mode="workspace-write", network=False, workspace=ws, state_dir=state,
                        cwd=ws, limits=Limits(10, 100, 20), bwrap="bwrap", prlimit="prlimit")
    assert "--seccomp" not in full
    assert full[-8:] == ["prlimit", "--cpu=10", f"--as={100 * 1024 * 1024}", "--nproc=20", "--", "/bin/sh", "-c",
                         "true"]
    ro_argv = bwrap_argv("read-only", False, ws, state, ws, seccomp=7)
    assert ro_argv[ro_argv.index("--seccomp") + 1] == "7"
    with pytest.raises(ValueError):
        bwrap_argv("sandboxed", False, ws, state, ws)


def test_protected_part_and_the_status_words(tmp_path: Path) -> None:
    assert protected_part("/w/.git/config", "/w") == ".git" and protected_part("/w/.git", "/w") == ".git"
    assert protected_part("/w/src/.git/x", "/w") is None and protected_part("/w/.gitignore", "/w") is None
    assert describe("workspace-write", False, Limits(), "prlimit").startswith("sandbox workspace-write, network off")
    assert "no seccomp filter" in describe("read-only", False, Limits(), "prlimit", seccomp=False)
    assert describe("read-only", True, Limits(), "prlimit").startswith("sandbox read-only, network on")
    assert describe("danger-full-access", False, Limits(), "prlimit").startswith("unsandboxed")
    assert "not enforced: the kernel exempts root" in describe("read-only", False, Limits(processes=5), "p", root=True)
    assert "no per-job limits" in describe("read-only", False, Limits(processes=5), None)
    with_cgroup = describe("read-only", False, Limits(processes=5), None, root=True, cgroup=Path("/cg"))
    assert "5 processes (a pids cgroup per job)" in with_cgroup and "not enforced" not in with_cgroup


# -- workspace-write through REST and MCP -------------------------------------------------------------------
async def test_workspace_write_confines_files_and_state(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    srv = await tool_server(ON, workspace=ws)
    state = srv.services.state.root
    token = srv.services.state.token()
    assert (state / "token").exists()

    assert (await run(srv, "echo inside > made.txt")).details["exit_code"] == 0
    assert (ws / "made.txt").read_text() == "inside\n"  # lands on the host

    mark = f"ctp-sandbox-{uuid.uuid4().hex}"
    res = await run(srv, f"echo x > {outside}/{mark}; echo x > /tmp/{mark} && cat /tmp/{mark}; "
                         f"echo x > /var/tmp/{mark}; echo x > {Path.home()}/{mark}; echo done")
    assert res.details["stdout"]["text"] == "x\ndone\n"  # the private /tmp works, inside the sandbox only
    assert not (outside / mark).exists() and not Path(f"/tmp/{mark}").exists()
    assert not Path(f"/var/tmp/{mark}").exists() and not (Path.home() / mark).exists()

    res = await run(srv, f"cat {state}/token; ls -A {state} | wc -l")
    assert token not in res.details["stdout"]["text"] and res.details["stdout"]["text"].strip() == "0"

    # A refused write is a non-zero status: 1 from bash, 2 from dash (whichever $SHELL the host has).
    res = await run(srv, "cat .git/config && echo more >> .git/config; echo refused=$(($? != 0)); "
                         "touch .git/new; echo refused=$(($? != 0))")
    assert "bare = false" in res.details["stdout"]["text"]
    assert "refused=1\nrefused=1" in res.details["stdout"]["text"]
    assert (ws / ".git" / "config").read_text() == "[core]\n\tbare = false\n" and not (ws / ".git" / "new").exists()

    mcp = await srv.mcp("exec_command", {"cmd": f"echo mcp > by-mcp.txt; echo x > {outside}/{mark}-mcp; "
                                                "echo y >> .git/config; true", "yield_time_ms": 30000}, **AGENT)
    assert not mcp.is_error, mcp.text
    assert (ws / "by-mcp.txt").read_text() == "mcp\n" and not (outside / f"{mark}-mcp").exists()
    assert "y" not in (ws / ".git" / "config").read_text()


async def test_read_only_leaves_only_the_private_tmp(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    srv = await tool_server({**ON, "shell.sandbox": "read-only"}, workspace=ws)
    res = await run(srv, "echo no > made.txt; echo refused=$(($? != 0)); echo yes > /tmp/t && cat /tmp/t")
    assert res.details["stdout"]["text"] == "refused=1\nyes\n" and not (ws / "made.txt").exists()


async def test_loopback_is_unreachable_unless_network_is_on(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    accepted = asyncio.Event()

    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        writer.write(b"hello\n")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    probe = (f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), 10); "
             f"print(s.recv(16).decode().strip())\"; echo rc=$?")
    try:
        off = await tool_server(ON, workspace=workspace(tmp_path / "a"))
        res = await run(off, probe)
        assert "hello" not in res.details["stdout"]["text"] and "rc=1" in res.details["stdout"]["text"]
        assert not accepted.is_set()
        on = await tool_server({**ON, "shell.network": True}, workspace=workspace(tmp_path / "b"))
        res = await run(on, probe)
        assert "hello\nrc=0" in res.details["stdout"]["text"] and accepted.is_set()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_code_cell_nested_exec_obeys_the_same_rules(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    srv = await tool_server({**ON, "code_mode.enabled": True}, workspace=ws)
    cmd = f"echo cell > cell.txt; echo x > {outside}/x; echo y >> .git/config; cat {srv.services.state.root}/token"
    code = f"const r = await tools.exec_command({{cmd: {cmd!r}}});\nreturn r.exit_code"
    res = await srv.rest("exec", {"code": code}, **AGENT)
    assert res.ok, res.body
    assert (ws / "cell.txt").read_text() == "cell\n" and not (outside / "x").exists()
    assert "y" not in (ws / ".git" / "config").read_text() and res.details["result"] != 0


def _processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


async def _until(check: Any, what: str, bound: float = 60.0) -> None:
    for _ in range(int(bound / 0.1)):
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(what)


async def test_terminating_a_session_leaves_no_process(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server({**ON, "shell.kill_after_ms": 500}, workspace=workspace(tmp_path))
    seconds = 900_000 + os.getpid() % 1000  # a marker no other process has
    cmd = f"trap '' TERM; setsid sleep {seconds} & sleep {seconds} & (sleep {seconds} &); echo ready; wait"
    first = await srv.rest("exec_command", {"cmd": cmd, "yield_time_ms": 1000}, **AGENT)
    assert first.ok and "session_id" in first.details, first.body
    await _until(lambda: len(_processes_with(f"sleep {seconds}")) >= 3, "the sleeps did not start")
    done = await srv.rest("write_stdin", {"session_id": first.details["session_id"], "terminate": True}, **AGENT)
    assert done.ok and done.details["terminated"] is True
    await _until(lambda: not _processes_with(f"sleep {seconds}"), "a process of the session outlived it")


async def test_limits_are_set_inside_the_job(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server({**ON, "shell.cpu_limit_s": 1, "shell.memory_limit_mb": 256, "shell.max_processes": 64},
                            workspace=workspace(tmp_path))
    limits = (await run(srv, "cat /proc/self/limits")).details["stdout"]["text"]
    assert any(line.startswith("Max cpu time") and " 1 " in line for line in limits.splitlines())
    if pids_cgroup() is None:  # RLIMIT_NPROC; with a pids cgroup the job's pids.max holds instead
        assert any(line.startswith("Max processes") and " 64 " in line for line in limits.splitlines())
    else:
        first = await srv.rest("exec_command", {"cmd": "sleep 60", "yield_time_ms": 250}, **AGENT)
        job = srv.services.extras["shell.family"].manager._jobs[first.details["session_id"]]
        assert job.cgroup is not None and (job.cgroup / "pids.max").read_text().strip() == "64"
        assert int((job.cgroup / "pids.current").read_text()) >= 1  # the job is in it
        await srv.rest("write_stdin", {"session_id": first.details["session_id"], "terminate": True}, **AGENT)
    assert any(line.startswith("Max address space") and str(256 * 1024 * 1024) in line for line in limits.splitlines())
    res = await run(srv, "python3 -c 'bytearray(1024 * 1024 * 1024)'")  # 1 GiB past a 256 MiB address space
    assert res.details["exit_code"] != 0 and "MemoryError" in res.details["stderr"]["text"]
    res = await run(srv, "while :; do :; done")  # one CPU second: SIGXCPU, or SIGKILL at the same hard limit
    assert res.details["exit_code"] in (128 + 24, 128 + 9)
    assert (await run(srv, "echo still up")).details["stdout"]["text"] == "still up\n"


BOMB = """import os, time
n = 0
while n < 1000:  # bounded, so a sandbox that failed to hold it cannot take the machine down
    try:
        pid = os.fork()
    except OSError as exc:
        print("refused", exc.errno)
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    n += 1
print("forked", n)
"""


async def test_a_fork_bomb_ends_at_its_limit(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    if os.geteuid() == 0 and pids_cgroup() is None:
        pytest.skip("running as root without a writable pids cgroup: the kernel never applies RLIMIT_NPROC to "
                    "root, so a fork bomb is not bounded here (status says so)")
    ws = workspace(tmp_path)
    (ws / "bomb.py").write_text(BOMB)
    srv = await tool_server({**ON, "shell.max_processes": 64}, workspace=ws)
    st = capability_status(srv.services.config, "shell")
    assert "64 processes" in st.reason and "not enforced" not in st.reason
    res = await run(srv, "python3 bomb.py", yield_time_ms=5000)
    out = res.details["stdout"]["text"]
    assert "refused 11" in out, out  # EAGAIN at the limit
    assert int(out.split("forked ")[1].split()[0]) < 64
    if "session_id" in res.details:  # its sleeping children keep the job running (issue 45, N4): end it
        done = await srv.rest("write_stdin", {"session_id": res.details["session_id"], "terminate": True}, **AGENT)
        assert done.ok and done.details["terminated"] is True, done.body
    await _until(lambda: not _processes_with("bomb.py"), "the bomb's processes outlived its job")
    assert (await run(srv, "echo still up")).details["stdout"]["text"] == "still up\n"
    cgroups = [j.cgroup for j in srv.services.extras["shell.family"].manager._in_cgroups if j.cgroup]
    await srv.close()  # the jobs' cgroups go with them, at the latest when the server stops
    assert not [path for path in cgroups if path.exists()]


# -- the other modes and the missing sandbox ------------------------------------------------------------------
async def test_danger_full_access_writes_through_and_says_unsandboxed(tool_server: Any, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    srv = await tool_server({**ON, "shell.sandbox": "danger-full-access"}, workspace=workspace(tmp_path))
    assert (await run(srv, f"echo x > {outside}/through; echo y >> .git/config")).details["exit_code"] == 0
    assert (outside / "through").read_text() == "x\n" and "y" in (tmp_path / "ws" / ".git" / "config").read_text()
    st = capability_status(srv.services.config, "shell")
    assert st.state == "active" and "unsandboxed" in st.reason


async def test_without_bwrap_sandboxed_modes_are_unavailable(tool_server: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    config = Config()
    config.shell.enabled, config.shell.sandbox = True, "workspace-write"
    st = capability_status(config, "shell")
    assert st.state == "unavailable" and "needs bubblewrap (bwrap), which is not on PATH" in st.reason
    config.shell.sandbox = "danger-full-access"
    assert capability_status(config, "shell").state == "active"
    srv = await tool_server(ON, workspace=workspace(tmp_path))  # the registry hides it: never run unconfined
    res = await srv.rest("exec_command", {"cmd": "echo x > leaked"}, **AGENT)
    assert not res.ok and "not on PATH" in str(res.body)
    assert not (tmp_path / "ws" / "leaked").exists()
    assert "exec_command" not in {s["name"] for s in await srv.list_rest()}


async def test_the_manager_refuses_when_the_sandbox_cannot_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Defence in depth: even a family built before bwrap went missing never spawns unconfined."""
    from tests.support.toolserver import make_services
    from tools_server.registry import CallContext
    from tools_server.shell.errors import ShellError
    from tools_server.shell.family import RawArgs, ShellFamily

    services = make_services(tmp_path, ON, workspace(tmp_path))
    family = ShellFamily(services)
    family.manager._probed, family.manager._sandbox_problem = True, "bubblewrap cannot create namespaces (test)"
    ctx = CallContext(services=services, task="t", agent="/root")
    try:
        with pytest.raises(ShellError, match="cannot create namespaces"):
            await family.exec_command(RawArgs.model_validate({"cmd": "echo x > leaked"}), ctx)
        assert not (tmp_path / "ws" / "leaked").exists()
    finally:
        await family.close()


# -- apply_patch keeps .git read-only too -------------------------------------------------------------------
async def test_apply_patch_refuses_git_in_a_sandboxed_mode(tool_server: Any, tmp_path: Path) -> None:
    patch = "*** Begin Patch\n*** Add File: .git/hooks/post-checkout\n+#!/bin/sh\n*** End Patch\n"
    srv = await tool_server({"apply_patch.enabled": True, "shell.sandbox": "workspace-write"},
                            workspace=workspace(tmp_path / "a"))
    res = await srv.rest("apply_patch", {"input": patch}, **AGENT)
    assert not res.ok and "read-only under shell.sandbox workspace-write" in res.text
    assert not (tmp_path / "a" / "ws" / ".git" / "hooks").exists()
    ok = "*** Begin Patch\n*** Add File: .gitignore\n+x\n*** End Patch\n"
    assert (await srv.rest("apply_patch", {"input": ok}, **AGENT)).ok
    free = await tool_server({"apply_patch.enabled": True, "shell.sandbox": "danger-full-access"},
                             workspace=workspace(tmp_path / "b"))
    assert (await free.rest("apply_patch", {"input": patch}, **AGENT)).ok
    # read-only: no patch lands anywhere in the workspace, the same as the shell's writes
    frozen = await tool_server({"apply_patch.enabled": True, "shell.sandbox": "read-only"},
                               workspace=workspace(tmp_path / "c"))
    res = await frozen.rest("apply_patch", {"input": ok}, **AGENT)
    assert not res.ok and "read-only under shell.sandbox read-only" in res.text
    assert not (tmp_path / "c" / "ws" / ".gitignore").exists()


# -- macOS: the Seatbelt profile and the decision, as pure functions ------------------------------------------
def test_seatbelt_profile_and_the_platform_decision(tmp_path: Path) -> None:
    from proxy.sandbox.seatbelt import backend_for, seatbelt_argv, seatbelt_problem, seatbelt_profile

    assert backend_for("linux") == "bubblewrap" and backend_for("darwin") == "seatbelt" and backend_for("win32") is None
    ww = seatbelt_profile("workspace-write", False, protected=2)
    assert ww.startswith("(version 1)\n(deny default)") and '(deny file-read* (subpath (param "STATE_DIR")))' in ww
    assert ('(allow file-write* (require-all (subpath (param "WORKSPACE")) (require-not (subpath (param '
            '"PROTECTED_0"))) (require-not (subpath (param "PROTECTED_1")))))') in ww
    assert "network" not in ww
    assert "(allow network*)" in seatbelt_profile("workspace-write", True)
    ro = seatbelt_profile("read-only", False)
    assert 'param "WORKSPACE"' not in ro and '(subpath (param "JOB_TMPDIR"))' in ro
    with pytest.raises(ValueError):
        seatbelt_profile("danger-full-access", False)
    ws = tmp_path / "w w"  # a path with a space and a quote is a parameter, never profile text
    argv = seatbelt_argv("workspace-write", False, ws, tmp_path / 's"t', tmp_path / "tmp", [ws / ".git"])
    assert argv[0] == "/usr/bin/sandbox-exec" and argv[1] == "-p" and argv[-1] == "--"
    assert f"-DWORKSPACE={ws}" in argv and f"-DPROTECTED_0={ws}/.git" in argv and str(ws) not in argv[2]
    assert seatbelt_problem("/nonexistent/sandbox-exec") is not None and seatbelt_problem(exists=True) is None
    assert sandbox_problem("danger-full-access", platform="darwin") is None
    assert "no sandbox on win32" in (sandbox_problem("read-only", platform="win32") or "")


def test_on_macos_the_sandboxed_modes_need_sandbox_exec_and_a_probe_that_ran(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision, with the platform and the probe faked (there is no Mac here): never `active` on what
    was not checked."""
    import proxy.sandbox.bwrap as sandbox
    import proxy.sandbox.seatbelt as seatbelt

    sandbox.seatbelt_check.cache_clear()
    missing = "Seatbelt's /usr/bin/sandbox-exec is not an executable here"
    monkeypatch.setattr(sandbox, "seatbelt_problem", lambda: missing)
    monkeypatch.setattr(sandbox, "seatbelt_probe", lambda: pytest.fail("no probe without sandbox-exec"))
    said = sandbox_problem("workspace-write", platform="darwin")
    assert said is not None and said.startswith(f"shell.sandbox workspace-write on macOS: {missing}")
    assert "danger-full-access" in said
    sandbox.seatbelt_check.cache_clear()
    monkeypatch.setattr(sandbox, "seatbelt_problem", lambda: None)
    monkeypatch.setattr(sandbox, "seatbelt_probe", lambda: "Seatbelt (/usr/bin/sandbox-exec) refused a probe command: "
                                                           "sandbox_apply: Operation not permitted")
    said = sandbox_problem("read-only", platform="darwin")
    assert said is not None and "refused a probe command: sandbox_apply: Operation not permitted" in said
    sandbox.seatbelt_check.cache_clear()
    monkeypatch.setattr(sandbox, "seatbelt_probe", lambda: None)
    assert sandbox_problem("workspace-write", platform="darwin") is None
    words = describe("workspace-write", False, Limits(10, 512, 64), None, platform="darwin")
    assert words.startswith("sandbox workspace-write, network off (Seatbelt; checked: /usr/bin/sandbox-exec is present "
                            "and a probe command ran under the profile)")
    assert "per-job limits (ulimit): cpu 10 s, address space 512 MiB" in words
    assert "64-process limit is not enforced on macOS" in words
    assert describe("danger-full-access", True, Limits(), None, platform="darwin").startswith("unsandboxed")
    sandbox.seatbelt_check.cache_clear()
    # the real probe on Linux: there is no sandbox-exec, so it says why instead of claiming anything
    assert seatbelt.seatbelt_probe("/nonexistent/sandbox-exec") is not None


def test_on_macos_commands_are_wrapped_with_sandbox_exec(tmp_path: Path) -> None:
    ws, state, tmp = tmp_path / "ws", tmp_path / "state", tmp_path / "tmp"
    argv = command_argv("/bin/zsh", "make test", mode="workspace-write", network=False, workspace=ws, state_dir=state,
                        cwd=ws, limits=Limits(10, 512, 64), bwrap=None, prlimit=None, platform="darwin",
                        job_tmpdir=tmp)
    assert argv[:2] == ["/usr/bin/sandbox-exec", "-p"] and "bwrap" not in " ".join(argv)
    profile = argv[2]
    assert '(allow file-write* (require-all (subpath (param "WORKSPACE"))' in profile and "network" not in profile
    assert f"-DWORKSPACE={ws}" in argv and f"-DSTATE_DIR={state}" in argv and f"-DJOB_TMPDIR={tmp}" in argv
    assert {f"-DPROTECTED_{i}={ws / n}" for i, n in enumerate((".git", ".agents", ".codex"))} <= set(argv)
    rest = argv[argv.index("--") + 1:]
    assert rest == ["/bin/sh", "-c", 'ulimit -t 10 && ulimit -v 524288 && exec "$@"', "sh", "/bin/zsh", "-c",
                    "make test"]
    ro = command_argv("/bin/sh", "ls", mode="read-only", network=True, workspace=ws, state_dir=state, cwd=ws,
                      limits=Limits(), bwrap=None, prlimit=None, platform="darwin", job_tmpdir=tmp)
    assert 'param "WORKSPACE"' not in ro[2] and "(allow network*)" in ro[2] and ro[-3:] == ["/bin/sh", "-c", "ls"]
    assert command_argv("/bin/sh", "ls", mode="danger-full-access", network=True, workspace=ws, state_dir=state,
                        cwd=ws, limits=Limits(), bwrap=None, prlimit=None, platform="darwin") == ["/bin/sh", "-c", "ls"]
    with pytest.raises(ValueError):
        command_argv("/bin/sh", "ls", mode="read-only", network=False, workspace=ws, state_dir=state, cwd=ws,
                     limits=Limits(), bwrap=None, prlimit=None, platform="darwin", job_tmpdir=None)


async def test_the_manager_on_macos_wraps_with_seatbelt_or_refuses(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The spawn's decision on a faked darwin: sandbox-exec around the command with a private TMPDIR when the
    check passed; a refusal (nothing run) when it did not."""
    import sys

    import proxy.sandbox.bwrap as sandbox
    from tools_server.shell.capture import CaptureStore
    from tools_server.shell.errors import ShellError
    from tools_server.shell.manager import Confinement, ShellManager

    ws = workspace(tmp_path)
    monkeypatch.setattr(sys, "platform", "darwin")
    box = Confinement("workspace-write", False, ws.resolve(), (tmp_path / "state").resolve(), Limits(5, 0, 0))
    sandbox.seatbelt_check.cache_clear()
    monkeypatch.setattr(sandbox, "seatbelt_check", lambda: None)
    manager = ShellManager(CaptureStore(tmp_path / "cap"), shell="/bin/sh", confinement=box)
    argv = await manager._argv("exec_command", "echo hi", ws)
    assert argv[0] == "/usr/bin/sandbox-exec" and argv[-3:] == ["/bin/sh", "-c", "echo hi"]
    assert manager._tmpdir is not None and f"-DJOB_TMPDIR={manager._tmpdir}" in argv
    assert manager._seccomp is None and manager._cgroups is None and manager._bwrap is None
    await manager.close()
    assert not manager._tmpdir.exists()
    monkeypatch.setattr(sandbox, "seatbelt_check", lambda: "Seatbelt's /usr/bin/sandbox-exec is not an executable here")
    refusing = ShellManager(CaptureStore(tmp_path / "cap2"), shell="/bin/sh", confinement=box)
    with pytest.raises(ShellError) as said:
        await refusing._argv("exec_command", "echo hi", ws)
    assert "sandbox-unavailable" in str(said.value.code) and "on macOS" in str(said.value)
    await refusing.close()


async def test_the_seccomp_filter_refuses_what_it_lists(bwrap: None, tool_server: Any, tmp_path: Path) -> None:
    from proxy.sandbox.bwrap import seccomp_program

    if seccomp_program() is None:
        pytest.skip("ctproxy has a seccomp program for x86_64 only")
    srv = await tool_server(ON, workspace=workspace(tmp_path))
    probe = ("python3 -c \"import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
             "r = libc.syscall(272, 0x10000000); print('unshare', r, ctypes.get_errno()); "  # CLONE_NEWUSER
             "r = libc.syscall(101, 0, os.getppid(), 0, 0); print('ptrace', r, ctypes.get_errno()); "  # ATTACH
             "r = libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0); r == 0 and os._exit(0); "  # clone(NEWUSER)
             "print('clone', r, ctypes.get_errno()); "
             "print('clone3', libc.syscall(435, 0, 0), ctypes.get_errno()); "
             "print('fanotify', libc.syscall(300, 0, 0), ctypes.get_errno()); "
             "print('getpid', libc.syscall(39) > 0)\"")
    out = (await run(srv, probe)).details["stdout"]["text"]
    assert "unshare -1 1\n" in out and "ptrace -1 1\n" in out and "getpid True" in out, out  # EPERM; others run
    assert "clone -1 1\n" in out and "clone3 -1 38\n" in out and "fanotify -1 1\n" in out, out  # clone3: ENOSYS
    st = capability_status(srv.services.config, "shell")
    assert "seccomp denies" in st.reason
    free = await tool_server({**ON, "shell.sandbox": "danger-full-access"}, workspace=workspace(tmp_path / "b"))
    out = (await run(free, "python3 -c \"import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
                           "print('unshare', libc.syscall(272, 0x10000000))\"")).details["stdout"]["text"]
    assert "unshare 0" in out  # unsandboxed, nothing is filtered (root may make a user namespace)
