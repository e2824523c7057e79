"""exec_command / write_stdin with real processes (no OS mocks), called through Tool.call."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

from proxy.config import Config
from proxy.state import StateDir
from tools_server.registry import CallContext, Registry, Services, ToolResult
from tools_server.service import ToolService
from tools_server.shell import ShellFamily, create_family
from tools_server.shell.procgroup import live_members

# The sandbox replaces /tmp with a private one: a virtualenv under /tmp (a clone there) is not visible to a command,
# but the interpreter it links to is (the scripts here need only the standard library).
PY = os.path.realpath(sys.executable) if os.path.realpath(sys.prefix).startswith("/tmp/") else sys.executable


class Harness:
    def __init__(self, family: ShellFamily, services: Services) -> None:
        self.family = family
        self.services = services
        tools = {t.name: t for t in family.tools()}
        self.exec_tool = tools["exec_command"]
        self.write_tool = tools["write_stdin"]

    def ctx(self, task: str | None = "t1", agent: str | None = "/root", **kw: Any) -> CallContext:
        return CallContext(services=self.services, task=task, agent=agent, **kw)

    async def exec(self, args: dict[str, Any], **kw: Any) -> ToolResult:
        return await self.exec_tool.call(args, self.ctx(**kw))

    async def write(self, args: dict[str, Any], **kw: Any) -> ToolResult:
        return await self.write_tool.call(args, self.ctx(**kw))


def make_harness(tmp_path: Path, **shell: Any) -> Harness:
    config = Config()
    config.shell.enabled = True
    for key, value in shell.items():
        setattr(config.shell, key, value)
    workspace = tmp_path / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    services = Services(config=config, state=StateDir.open(tmp_path / "state"), workspace=workspace)
    return Harness(create_family(services), services)


@pytest.fixture
async def sh(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = make_harness(tmp_path, kill_after_ms=1000)
    yield harness
    await harness.family.close()


def ok(result: ToolResult) -> dict[str, Any]:
    assert not result.is_error, result.text
    return result.details


def stdout(result: ToolResult) -> str:
    return ok(result)["stdout"]["text"]


# -- basics --------------------------------------------------------------------------------------------
async def test_short_command_returns_output_and_exit_in_one_call(sh: Harness) -> None:
    res = await sh.exec({"cmd": "echo hi; echo oops >&2; exit 3"})
    d = ok(res)
    assert d["exit_code"] == 3 and "session_id" not in d
    assert d["stdout"]["text"] == "hi\n" and d["stderr"]["text"] == "oops\n"
    lines = res.text.split("\n")
    assert lines[0].startswith("Chunk ID: ") and len(lines[0]) == len("Chunk ID: ") + 6
    assert lines[1].startswith("Wall time: ") and lines[1].endswith(" seconds")
    assert lines[2] == "Process exited with code 3"
    assert lines[3] == "Original token count: 2"
    assert lines[4] == "Output:"
    assert res.text.endswith("hi\nStderr:\noops\n")
    assert d["recovery"] == {}  # small and fully delivered: no file needed


async def test_exit_codes_and_signals(sh: Harness, tmp_path: Path) -> None:
    assert ok(await sh.exec({"cmd": "exit 0"}))["exit_code"] == 0
    assert ok(await sh.exec({"cmd": "false"}))["exit_code"] == 1
    # sandboxed (the default), bubblewrap reports a signal as the shell does: 128 + its number
    assert ok(await sh.exec({"cmd": "kill -KILL $$"}))["exit_code"] == 137
    h = make_harness(tmp_path / "unsandboxed", sandbox="danger-full-access")  # the signal itself is seen
    try:
        d = ok(await h.exec({"cmd": "kill -KILL $$"}))
        assert d["exit_code"] == 137 and d["signal"] == "SIGKILL"
    finally:
        await h.family.close()


async def test_env_is_inherited_and_cwd_resolved(sh: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    (sh.services.workspace / "sub").mkdir()
    assert stdout(await sh.exec({"cmd": "pwd", "workdir": "sub"})).strip() == str(sh.services.workspace / "sub")
    assert stdout(await sh.exec({"cmd": "pwd"})).strip() == str(sh.services.workspace)
    res = await sh.exec({"cmd": "pwd", "workdir": "missing"})
    assert res.is_error and res.details["error"] == "bad-cwd"


# -- continuation and polling ------------------------------------------------------------------------------
async def test_long_command_continues_across_polls(sh: Harness) -> None:
    cmd = "for i in 1 2 3 4 5 6 7; do echo line$i; sleep 1; done; echo end"
    first = ok(await sh.exec({"cmd": cmd, "yield_time_ms": 500}))
    sid = first["session_id"]
    assert "line7" not in first["stdout"]["text"]
    seen = first["stdout"]["text"]
    polls = 0
    while True:
        d = ok(await sh.write({"session_id": sid}))
        polls += 1
        seen += d["stdout"]["text"]
        if "exit_code" in d:
            break
        assert d["session_id"] == sid
    assert polls >= 2  # at least one poll saw it still running
    assert seen == "".join(f"line{i}\n" for i in range(1, 8)) + "end\n"
    assert d["exit_code"] == 0


async def test_quiet_then_bursty_output(sh: Harness) -> None:
    cmd = f"sleep 0.6; {PY} -c \"import sys; sys.stdout.write('x'*100000)\"; sleep 0.6; echo; echo end"
    first = ok(await sh.exec({"cmd": cmd, "yield_time_ms": 300}))
    assert first["stdout"]["text"] == "" and "session_id" in first
    d = ok(await sh.write({"session_id": first["session_id"], "max_output_tokens": 100_000}))
    assert d["exit_code"] == 0
    assert d["stdout"]["text"] == "x" * 100000 + "\nend\n"
    assert d["stdout"]["bytes"] == 100005


async def test_utf8_split_across_chunks(sh: Harness) -> None:
    cmd = r"printf 'a\342\202'; sleep 0.8; printf '\254b\n'"
    first = ok(await sh.exec({"cmd": cmd, "yield_time_ms": 300}))
    assert first["stdout"]["text"] in ("", "a")  # the half euro sign is held back, not mangled
    d = ok(await sh.write({"session_id": first["session_id"]}))
    assert first["stdout"]["text"] + d["stdout"]["text"] == "a€b\n"
    assert d["stdout"]["text"].startswith(("a€", "€"))
    path = Path(d["recovery"]["stdout"]["path"])
    assert path.read_bytes() == "a€b\n".encode()
    assert d["recovery"]["stdout"]["state"] == "complete"


async def test_same_group_child_keeps_the_job_running(tmp_path: Path) -> None:
    # danger-full-access: the leader exits at once; a child with redirected output is still part of the job
    # (sandboxed, the job's pid namespace ends with its command: tests/tools_server/shell/test_shell_sandbox.py)
    h = make_harness(tmp_path, sandbox="danger-full-access")
    try:
        first = ok(await h.exec({"cmd": "sleep 1.5 >/dev/null 2>&1 & echo started", "yield_time_ms": 1000}))
        assert "session_id" in first
        d = ok(await h.write({"session_id": first["session_id"]}))
        assert d["exit_code"] == 0
        assert first["stdout"]["text"] + d["stdout"]["text"] == "started\n"
    finally:
        await h.family.close()


# -- stdin ---------------------------------------------------------------------------------------------
async def test_interactive_cat_exact_bytes(sh: Harness) -> None:
    first = ok(await sh.exec({"cmd": "cat", "yield_time_ms": 250}))
    sid = first["session_id"]
    d = ok(await sh.write({"session_id": sid, "chars": "no newline", "yield_time_ms": 1000}))
    assert d["inputDelivery"] == "written"
    echoed = d["stdout"]["text"]
    payload = "tab\there\r\nünï €\x01\n"
    d = ok(await sh.write({"session_id": sid, "chars": payload, "yield_time_ms": 1000}))
    assert d["inputBytes"] == len(payload.encode())
    echoed += d["stdout"]["text"]
    d = ok(await sh.write({"session_id": sid, "closeStdin": True, "yield_time_ms": 5000}))
    assert d["exit_code"] == 0 and not d["stdinOpen"]
    assert echoed + d["stdout"]["text"] == "no newline" + payload  # exactly, nothing added


async def test_interactive_python(sh: Harness) -> None:
    first = ok(await sh.exec({"cmd": f"{PY} -u -i -q", "yield_time_ms": 1000}))
    sid = first["session_id"]
    out, err = first["stdout"]["text"], first["stderr"]["text"]
    d = ok(await sh.write({"session_id": sid, "chars": "print(6*7)\n", "yield_time_ms": 1000}))
    out, err = out + d["stdout"]["text"], err + d["stderr"]["text"]
    d = ok(await sh.write({"session_id": sid, "chars": "x = 'é'\nprint(x * 3)\n", "yield_time_ms": 1000}))
    out, err = out + d["stdout"]["text"], err + d["stderr"]["text"]
    d = ok(await sh.write({"session_id": sid, "closeStdin": True, "yield_time_ms": 5000}))
    assert d["exit_code"] == 0
    out, err = out + d["stdout"]["text"], err + d["stderr"]["text"]
    assert out == "42\nééé\n"
    assert ">>> " in err  # without a TTY, python prompts on stderr


async def test_input_after_eof_is_refused_and_eof_twice_is_harmless(sh: Harness) -> None:
    sid = ok(await sh.exec({"cmd": "cat; sleep 2", "yield_time_ms": 250}))["session_id"]
    assert ok(await sh.write({"session_id": sid, "closeStdin": True}))["stdinOpen"] is False
    assert not (await sh.write({"session_id": sid, "closeStdin": True})).is_error
    res = await sh.write({"session_id": sid, "chars": "late\n"})
    assert res.is_error and res.details["error"] == "stdin-closed"


async def test_stdin_overload_and_unknown_delivery(sh: Harness) -> None:
    # `sleep` never reads: the pipe fills, delivery becomes unknown, reservations pile up
    sid = ok(await sh.exec({"cmd": "sleep 30", "yield_time_ms": 250}))["session_id"]
    big = await sh.write({"session_id": sid, "chars": "x" * 262_145})
    assert big.is_error and big.details["error"] == "stdin-overload"
    accepted: list[ToolResult] = []
    for _ in range(10):
        res = await sh.write({"session_id": sid, "chars": "y" * 65_536})
        if res.is_error:
            break
        accepted.append(res)
    assert res.is_error and res.details["error"] == "stdin-overload"
    # the kernel pipe took some; at most 262,144 bytes can wait in our envelope on top of it
    unknown = [r for r in accepted if r.details["inputDelivery"] == "unknown"]
    assert 1 <= len(unknown) <= 4 and len(accepted) <= 8
    assert accepted[-1].details["inputDelivery"] == "unknown"
    assert "Input delivery unknown" in accepted[-1].text
    ok(await sh.write({"session_id": sid, "terminate": True}))


# -- preview and capture ----------------------------------------------------------------------------------
async def test_preview_drop_and_intact_capture(sh: Harness) -> None:
    script = (
        "import sys\n"
        "out = sys.stdout.buffer\n"
        "for i in range(40000):\n"
        "    out.write(f'{i:06d} ünïcødé €✓ line\\n'.encode())\n"
    )
    (sh.services.workspace / "gen.py").write_text(script)
    expected = b"".join(f"{i:06d} ünïcødé €✓ line\n".encode() for i in range(40000))
    res = await sh.exec({"cmd": f"{PY} gen.py", "max_output_tokens": 1000})
    d = ok(res)
    assert "Warning: truncated output" in res.text and "tokens truncated…" in res.text
    out = d["stdout"]
    assert out["bytes"] == len(expected)
    assert out["dropped"] > 0 and out["truncated"] > 0
    assert out["dropped"] + out["shownBytes"] + out["truncated"] == len(expected)
    assert len(out["text"].encode()) <= 4000
    assert expected.decode().endswith(out["text"].split("tokens truncated…\n")[-1])
    rec = d["recovery"]["stdout"]
    assert rec["state"] == "complete" and rec["bytes"] == rec["capturedBytes"] == len(expected)
    path = Path(rec["path"])
    assert path.read_bytes() == expected
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert path.parent.parent == sh.services.state.root / "captures"
    assert f"Full stdout (complete, {len(expected)} bytes): {path}" in res.text
    assert "stderr" not in d["recovery"]  # nothing lost there: no file


async def test_running_job_publishes_stable_paths(sh: Harness) -> None:
    first = ok(await sh.exec({"cmd": "sleep 0.5; echo done", "yield_time_ms": 250}))
    rec = first["recovery"]
    assert rec["stdout"]["state"] == "capturing" and rec["stdout"]["bytes"] == 0
    path = rec["stdout"]["path"]
    d = ok(await sh.write({"session_id": first["session_id"]}))
    assert d["recovery"]["stdout"]["path"] == path
    assert d["recovery"]["stdout"]["state"] == "complete"
    assert Path(path).read_text() == "done\n"


async def test_missing_capture_file_is_reported(sh: Harness) -> None:
    first = ok(await sh.exec({"cmd": "sleep 0.5; echo done", "yield_time_ms": 250}))
    os.unlink(first["recovery"]["stdout"]["path"])
    d = ok(await sh.write({"session_id": first["session_id"]}))
    assert d["recovery"]["stdout"]["state"] == "unavailable"
    assert d["recovery"]["stdout"]["reason"] == "missing"


# -- handles, readers, caps ---------------------------------------------------------------------------------
async def test_stale_handles(sh: Harness) -> None:
    sid = ok(await sh.exec({"cmd": "sleep 0.3; echo x", "yield_time_ms": 250}))["session_id"]
    ok(await sh.write({"session_id": sid}))  # the terminal observer
    res = await sh.write({"session_id": sid})
    assert res.is_error and res.details["error"] == "stale-session"
    res = await sh.write({"session_id": "424242"})
    assert res.is_error and res.details["error"] == "stale-session"


async def test_sessions_belong_to_their_caller(sh: Harness) -> None:
    sid = ok(await sh.exec({"cmd": "sleep 5", "yield_time_ms": 250}))["session_id"]
    res = await sh.write({"session_id": sid, "terminate": True}, task="other")
    assert res.is_error and res.details["error"] == "stale-session"
    ok(await sh.write({"session_id": sid, "terminate": True}))


async def test_numeric_session_ids(sh: Harness) -> None:
    first = ok(await sh.exec({"cmd": "cat", "yield_time_ms": 250}))
    sid = first["session_id"]
    assert isinstance(sid, str) and sid.isdigit()
    d = ok(await sh.write({"session_id": int(sid), "chars": "n\n", "yield_time_ms": 2000}))
    assert d["stdout"]["text"] == "n\n"
    d = ok(await sh.write({"sessionId": float(sid), "closeStdin": True, "yield_time_ms": 2000}))
    assert d["exit_code"] == 0


async def test_two_concurrent_readers(sh: Harness) -> None:
    cmd = "for i in 1 2 3 4 5 6; do echo r$i; sleep 0.2; done"
    sid = ok(await sh.exec({"cmd": cmd, "yield_time_ms": 250}))["session_id"]
    a, b = await asyncio.gather(sh.write({"session_id": sid}), sh.write({"session_id": sid}))
    results = [a, b]
    winners = [r for r in results if not r.is_error]
    losers = [r for r in results if r.is_error]
    assert len(winners) == 1 and len(losers) == 1  # one terminal observer wins
    assert losers[0].details["error"] == "stale-session"
    assert winners[0].details["exit_code"] == 0


async def test_concurrent_readers_never_duplicate_output(sh: Harness) -> None:
    cmd = "for i in $(seq 1 40); do echo r$i; sleep 0.05; done; sleep 30"
    start = ok(await sh.exec({"cmd": cmd, "yield_time_ms": 250}))
    sid = start["session_id"]
    got = start["stdout"]["text"] + stdout(await sh.write({"session_id": sid}))
    rest = await asyncio.gather(*(sh.write({"session_id": sid}) for _ in range(3)))
    got += "".join(stdout(r) for r in rest)
    lines = got.split()
    assert lines == [f"r{i}" for i in range(1, len(lines) + 1)]  # in order, nothing twice
    assert len(lines) == 40
    ok(await sh.write({"session_id": sid, "terminate": True}))


async def test_job_cap(sh: Harness) -> None:
    sids = [ok(await sh.exec({"cmd": "sleep 30", "yield_time_ms": 250}))["session_id"] for _ in range(16)]
    res = await sh.exec({"cmd": "touch capped", "yield_time_ms": 250})
    assert res.is_error and res.details["error"] == "job-cap"
    assert not (sh.services.workspace / "capped").exists()
    assert not (await sh.exec({"cmd": "true"}, task="someone-else")).is_error  # caps are per caller
    ok(await sh.write({"session_id": sids[0], "terminate": True}))
    assert ok(await sh.exec({"cmd": "echo fits"}))["exit_code"] == 0


async def test_refusals_happen_before_any_spawn(sh: Harness) -> None:
    ws = sh.services.workspace
    cases = [
        {"cmd": "touch a", "command": "touch b"},
        {"cmd": "touch a", "shell": "/bin/bash"},
        {"cmd": "touch a", "tty": True},
        {"cmd": "touch a", "login": False},
        {"cmd": "touch a", "max_output_tokens": 1, "maxOutputBytes": 5},
        {"cmd": "touch a", "unknown_thing": 1},
    ]
    for args in cases:
        res = await sh.exec(args)
        assert res.is_error, args
        assert res.text.startswith("exec_command failed: ")
    assert not (ws / "a").exists() and not (ws / "b").exists()
    assert sh.family.manager._jobs == {}


async def test_spawn_failure_takes_no_slot(tmp_path: Path) -> None:
    h = make_harness(tmp_path, shell="/nonexistent/shell", max_jobs=1)
    try:
        for _ in range(3):
            res = await h.exec({"cmd": "true"})
            assert res.is_error and res.details["error"] == "spawn-failed"
    finally:
        await h.family.close()


# -- stop, cancel, close -----------------------------------------------------------------------------------
async def test_terminate_children_that_ignore_sigterm(tmp_path: Path) -> None:
    # the process-group machinery of danger-full-access (a sandboxed job runs in its own pid namespace)
    h = make_harness(tmp_path, sandbox="danger-full-access")  # the real 5 s grace
    try:
        cmd = "trap '' TERM; sleep 1000 & sleep 1000 & echo ready; wait"
        first = ok(await h.exec({"cmd": cmd, "yield_time_ms": 500}))
        job = h.family.manager._jobs[first["session_id"]]
        assert len(await asyncio.to_thread(live_members, job.pgid)) >= 3
        t0 = time.monotonic()
        d = ok(await h.write({"session_id": first["session_id"], "terminate": True}))
        assert time.monotonic() - t0 >= 4.5  # SIGTERM was ignored; SIGKILL came after the grace
        assert d["exit_code"] == 137 and d["signal"] == "SIGKILL"
        assert d["terminated"] is True and d["unknownOutcome"] is False
        assert await asyncio.to_thread(live_members, job.pgid) == []
    finally:
        await h.family.close()


async def test_cancelling_a_direct_call_stops_its_job(sh: Harness) -> None:
    ctx = sh.ctx()
    call = asyncio.ensure_future(sh.exec_tool.call({"cmd": "echo go; sleep 1000", "yield_time_ms": 20000}, ctx))
    await asyncio.sleep(0.5)
    ctx.cancel.set()
    res = await asyncio.wait_for(call, 10)
    assert res.details["terminated"] is True and res.details["exit_code"] == 143
    assert sh.family.manager._jobs == {}


async def test_task_cancellation_stops_the_job(sh: Harness) -> None:
    call = asyncio.ensure_future(sh.exec({"cmd": "sleep 1000", "yield_time_ms": 20000}))
    await asyncio.sleep(0.5)
    (job,) = sh.family.manager._jobs.values()
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    await asyncio.wait_for(job.complete.wait(), 10)
    assert await asyncio.to_thread(live_members, job.pgid) == []


async def test_close_leaves_no_process_and_no_own_file(tmp_path: Path) -> None:
    h = make_harness(tmp_path, kill_after_ms=500, sandbox="danger-full-access")  # its process group
    first = ok(await h.exec({"cmd": "trap '' TERM; sleep 1000 & sleep 1000 & wait", "yield_time_ms": 300}))
    job = h.family.manager._jobs[first["session_id"]]
    capture_dir = Path(first["recovery"]["stdout"]["path"]).parent
    foreign = capture_dir / "not-ours.txt"
    foreign.write_text("keep me")
    assert len(await asyncio.to_thread(live_members, job.pgid)) >= 3
    await h.family.close()
    assert await asyncio.to_thread(live_members, job.pgid) == []
    assert sorted(p.name for p in capture_dir.iterdir()) == ["not-ours.txt"]  # only ours removed
    res = await h.exec({"cmd": "true"})
    assert res.is_error and res.details["error"] == "owner-closed"


# -- the invocation seam ----------------------------------------------------------------------------------
class RecordingHooks:
    calls: ClassVar[list[dict[str, Any]]] = []

    def context(self, call: Any) -> dict[str, Any]:
        RecordingHooks.calls.append(call.as_dict())
        return {"env": {"CTP_OVERLAY": f"for-{call.task}"}}

    async def policy(self, call: Any) -> str | None:
        if call.task == "forbidden":
            return "this task may not run commands"
        return None


class BadOverlayHooks:
    def context(self, call: Any) -> dict[str, Any]:
        return {"env": {"BAD=NAME": "x"}}


def on_the_road(h: Harness) -> ToolService:
    """The policy seam is the road's (tools_server/service.py): these calls take it, as every transport does."""
    return ToolService(h.services, Registry([h.family], h.services.config))


async def road_exec(h: Harness, args: dict[str, Any], task: str = "t1") -> ToolResult:
    svc = on_the_road(h)
    return await svc.call("exec_command", args, svc.context(transport="direct", task=task, agent="/root"))


async def test_env_overlay_and_policy_refusal(tmp_path: Path) -> None:
    h = make_harness(tmp_path, policy="tests.tools_server.shell.test_shell_sessions:RecordingHooks")
    try:
        RecordingHooks.calls.clear()
        assert "CTP_OVERLAY" not in os.environ
        d = ok(await road_exec(h, {"cmd": 'echo "$CTP_OVERLAY"'}))
        assert d["stdout"]["text"] == "for-t1\n"
        assert "CTP_OVERLAY" not in os.environ and "CTP_OVERLAY" not in h.family.manager._env
        call = RecordingHooks.calls[-1]
        assert call["tool"] == "exec_command" and call["path"] == "direct"
        assert call["cwd"] == str(h.services.workspace) and "cmd" not in call
        res = await road_exec(h, {"cmd": "touch refused"}, task="forbidden")
        assert res.is_error and res.details["error"] == "policy-refused"
        assert "this task may not run commands" in res.text
        assert not (h.services.workspace / "refused").exists()
    finally:
        await h.family.close()


async def test_invalid_overlay_refused_before_spawn(tmp_path: Path) -> None:
    h = make_harness(tmp_path, policy="tests.tools_server.shell.test_shell_sessions.BadOverlayHooks")
    try:
        res = await road_exec(h, {"cmd": "touch x"})
        assert res.is_error and res.details["error"] == "invalid-env-overlay"
        assert not (h.services.workspace / "x").exists()
    finally:
        await h.family.close()


# -- ordering, pruning, early cancel ------------------------------------------------------------------------
async def test_input_is_not_queued_behind_a_quiet_poll(sh: Harness) -> None:
    sid = ok(await sh.exec({"cmd": "cat", "yield_time_ms": 250}))["session_id"]
    poll = asyncio.ensure_future(sh.write({"session_id": sid, "yield_time_ms": 20_000}))
    await asyncio.sleep(0.2)
    d = ok(await sh.write({"session_id": sid, "chars": "now\n", "yield_time_ms": 2000}))
    assert not poll.done()  # the long poll is still waiting, the input went through
    assert d["stdout"]["text"] == "now\n" and d["inputDelivery"] == "written"
    stop = await sh.write({"session_id": sid, "terminate": True})
    polled = await asyncio.wait_for(poll, 10)
    # exactly one terminal observer reads the exit; a stop that lost the race still says the stop happened
    readers = [r for r in (stop, polled) if "exit_code" in r.details]
    assert len(readers) == 1 and readers[0].details["exit_code"] == 143
    assert not stop.is_error and (stop.details.get("exit_code") == 143 or stop.details["read_by_another_call"])
    assert [r.details["error"] for r in (stop, polled) if r.is_error] in ([], ["stale-session"])


async def test_delivered_input_is_never_reported_as_a_failure(sh: Harness) -> None:
    """Seed 004 defect 13: input a long poll's session consumed and exited on is delivered, whichever call
    reads the exit: the writer is told so, never `stale-session`."""
    for _ in range(3):  # either order of the race: the answer is never a failure
        sid = ok(await sh.exec({"cmd": "read x; echo got $x", "yield_time_ms": 250}))["session_id"]
        poll = asyncio.ensure_future(sh.write({"session_id": sid, "yield_time_ms": 20_000}))
        await asyncio.sleep(0.1)
        wrote = await sh.write({"session_id": sid, "chars": "abc\n", "yield_time_ms": 5000})
        polled = await asyncio.wait_for(poll, 30)
        assert not wrote.is_error, wrote.text
        assert wrote.details["inputDelivery"] == "written"
        outputs = [r.details["stdout"]["text"] for r in (wrote, polled) if "exit_code" in r.details]
        assert outputs == ["got abc\n"]  # read exactly once, by one of the two
        assert wrote.details.get("read_by_another_call") or "exit_code" in wrote.details


async def test_terminal_handles_beyond_32_are_pruned_oldest_first(sh: Harness) -> None:
    manager = sh.family.manager
    jobs = []
    for _ in range(3):
        for _ in range(12):
            sid = ok(await sh.exec({"cmd": "sleep 0.3", "yield_time_ms": 250}))["session_id"]
            jobs.append(manager._jobs[sid])
        await asyncio.sleep(1.0)  # let the batch finish unread
    assert all(j.settled for j in jobs)
    sh.family.manager.lookup("write_stdin", ("t1", "/root"), jobs[-1].id)  # any call prunes lazily
    pruned = [j for j in jobs if j.released]
    kept = [j for j in jobs if not j.released]
    assert len(kept) == 32 and len(pruned) == 4
    assert max(j.finished_at or 0 for j in pruned) <= min(j.finished_at or 0 for j in kept)
    stale = await sh.write({"session_id": pruned[0].id})
    assert stale.is_error and stale.details["error"] == "stale-session"
    assert ok(await sh.write({"session_id": kept[0].id}))["exit_code"] == 0


async def test_terminal_handles_expire(sh: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from tools_server.shell import manager as manager_module

    sid = ok(await sh.exec({"cmd": "sleep 0.3", "yield_time_ms": 250}))["session_id"]
    for job in list(sh.family.manager._jobs.values()):  # wait for the exit itself, not a guess of its time
        await asyncio.wait_for(job.complete.wait(), 30)
    monkeypatch.setattr(manager_module.limits, "TERMINAL_HANDLE_TTL_S", 0.01)
    await asyncio.sleep(0.05)  # a lower bound is all that matters: at least the TTL has passed since the exit
    res = await sh.write({"session_id": sid})
    assert res.is_error and res.details["error"] == "stale-session"


async def test_a_call_cancelled_before_start_runs_nothing(sh: Harness) -> None:
    ctx = sh.ctx()
    ctx.cancel.set()
    res = await sh.exec_tool.call({"cmd": "touch ran"}, ctx)
    assert res.is_error and res.details["error"] == "cancelled"
    assert not (sh.services.workspace / "ran").exists()


async def test_cancelling_write_stdin_stops_the_job_without_writing(sh: Harness) -> None:
    sid = ok(await sh.exec({"cmd": "cat > got.txt", "yield_time_ms": 250}))["session_id"]
    ctx = sh.ctx()
    ctx.cancel.set()
    res = await sh.write_tool.call({"session_id": sid, "chars": "never\n"}, ctx)
    assert ok(res)["exit_code"] == 143 and "inputDelivery" not in res.details
    assert (sh.services.workspace / "got.txt").read_text() == ""


@pytest.mark.skipif(sys.platform != "linux", reason="MAX_ARG_STRLEN (one argument over 128 KiB) is Linux's rule")
async def test_an_over_long_command_is_named_as_such(sh: Harness) -> None:
    """Seed 004 defect 17: a command past the system's one-argument limit is not blamed on shell.shell."""
    res = await sh.exec({"cmd": f"echo {'a' * 200_000} | wc -c"})
    assert res.is_error and res.details["error"] == "argument-too-long", res.text
    assert "shell.shell" not in res.text and "write_stdin" in res.text


async def test_a_server_wide_cap_bounds_jobs_whatever_the_agent_names(sh: Harness) -> None:
    """Seed 004 defect 19: x-ctp-agent is free text, so the per-caller cap alone bounds nothing."""
    sh.family.manager.max_jobs, sh.family.manager.max_jobs_total = 2, 3
    sids = []
    for agent in ("/root/a", "/root/a", "/root/b"):
        sids.append((agent, ok(await sh.exec({"cmd": "sleep 30", "yield_time_ms": 250}, agent=agent))["session_id"]))
    mine = await sh.exec({"cmd": "sleep 30", "yield_time_ms": 250}, agent="/root/a")
    assert mine.is_error and "2 commands are still running" in mine.text
    other = await sh.exec({"cmd": "touch never", "yield_time_ms": 250}, agent="/root/c")
    assert other.is_error and other.details["error"] == "job-cap" and "all callers" in other.text
    assert not (sh.services.workspace / "never").exists()
    for agent, sid in sids:
        assert ok(await sh.write({"session_id": sid, "terminate": True}, agent=agent))["exit_code"] is not None
    assert ok(await sh.exec({"cmd": "true"}, agent="/root/c"))["exit_code"] == 0
