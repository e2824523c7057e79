"""Hostile inputs the tool server must answer with a clear `ok: false` tool error, never a 500 or a
traceback (issue 10 §6); no default workspace (§14); errors the model can read over MCP and
read-only annotations (§15). Calls go through the real server: REST and the official MCP client."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config import Config, set_key
from proxy.notes import NotesStore
from proxy.state import StateDir
from tests.support.ports import listening_port
from tests.support.toolserver import ToolServerHandle
from tests.tools_server.history.test_history_tools import build_world
from tools_server.app import SERVICE_KEY
from tools_server.registry import Services, ToolError, ToolResult

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]
SECRET = "outside-secret-content"
READ_ONLY = {"history_list_windows", "history_list_items", "history_read_item", "history_search_contents",
             "notes_list_files_by_prefix", "notes_read_file", "notes_search_contents", "get_context_remaining"}
WRITERS = {"notes_append_to_file", "notes_write_file", "apply_patch", "exec_command", "write_stdin"}
ALL_ON = {"apply_patch.enabled": True, "shell.enabled": True}


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    """Nothing was logged with a traceback or at ERROR (aiohttp's 'Error handling request', the MCP SDK)."""
    bad = [f"{r.name}: {r.getMessage()[:200]}" for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not bad, bad


def services_for(tmp: Path, workspace: Path | None, overrides: dict[str, Any] | None = None) -> Services:
    config = Config()
    for key, value in (overrides or {}).items():
        config = set_key(config, key, json.dumps(value))
    return Services(config=config, state=StateDir.open(tmp / "state"), workspace=workspace)


@pytest.fixture
async def server(tmp_path: Path):
    """Factory: a started tool server for `Services`; closed after the test."""
    handles: list[ToolServerHandle] = []

    async def start(services: Services) -> ToolServerHandle:
        handle = ToolServerHandle(services, services.state.token())
        await handle.start()
        handles.append(handle)
        return handle

    yield start
    for h in handles:
        await h.close()


@pytest.fixture
async def notes_world(tmp_path: Path, server):
    """A server, a task with /root, a note, and outside the notes root a file and a directory that
    links inside /root's notes point at."""
    ws = tmp_path / "ws"
    ws.mkdir()
    srv = await server(services_for(tmp_path, ws, ALL_ON))
    world = build_world(srv.services.state, srv.services)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(SECRET + "\n")
    ok = await srv.rest("notes_write_file", {"path": "plan.md", "text": "the plan\n"}, task=world.task)
    assert ok.ok, ok.body
    root = NotesStore(srv.services.state.subdir("notes"), world.task).agent_dir("/root")
    os.symlink(outside / "secret.txt", root / "link.md")
    os.symlink(outside, root / "linkdir")
    yield srv, world.task, outside
    world.journal.close()


def error_of(res: Any) -> tuple[str, str]:
    """(code, message) of a REST tool error answered as `ok: false` (HTTP 200), or of an MCP error."""
    if hasattr(res, "status"):
        assert res.status == 200, (res.status, res.body)
        assert res.body["ok"] is False, res.body
        return res.body["details"]["error"], res.body["text"]
    assert res.is_error, res.text
    assert res.structured is not None and res.structured["ok"] is False, res.structured
    assert res.structured["message"] == res.text
    return res.structured["error"], res.text


# ------------------------------------------------------------------------------------------ notes (§6)

@pytest.mark.parametrize("name,args", [
    ("notes_read_file", {"path": "link.md"}),
    ("notes_append_to_file", {"path": "link.md", "text": "appended"}),
    ("notes_write_file", {"path": "link.md", "text": "replaced"}),
    ("notes_read_file", {"path": "linkdir/secret.txt"}),
    ("notes_write_file", {"path": "linkdir/new.txt", "text": "new"}),
    ("notes_append_to_file", {"path": "linkdir/secret.txt", "text": "appended"}),
])
async def test_symlinks_out_of_the_notes_root_are_clear_errors(notes_world, caplog, name, args) -> None:
    srv, task, outside = notes_world
    for call in (srv.rest, srv.mcp):
        code, message = error_of(await call(name, args, task=task))
        assert code == "notes_error" and "symbolic link" in message and "never follow" in message
        assert SECRET not in message
    assert (outside / "secret.txt").read_text() == SECRET + "\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    no_tracebacks(caplog)


async def test_search_skips_links_and_still_finds_real_notes(notes_world, caplog) -> None:
    srv, task, _ = notes_world
    for call in (srv.rest, srv.mcp):
        found = await call("notes_search_contents", {"query": "plan"}, task=task)
        assert "plan.md:1: the plan" in found.text
        leaked = await call("notes_search_contents", {"query": "secret"}, task=task)
        assert "0 file(s)" in leaked.text and SECRET not in leaked.text
    no_tracebacks(caplog)


async def test_listing_never_shows_a_link(notes_world) -> None:
    srv, task, _ = notes_world
    for call in (srv.rest, srv.mcp):
        listed = await call("notes_list_files_by_prefix", {}, task=task)
        paths = [json.loads(line)["path"] for line in listed.text.splitlines() if line.startswith("{")]
        assert paths == ["plan.md"], listed.text


@pytest.mark.parametrize("name", ["notes_read_file", "notes_write_file", "notes_append_to_file"])
@pytest.mark.parametrize("path", ["a" * 200 + "/" + "b" * 200 + "/" + ("c/" * 2000) + "d",  # over 4 KB
                                  "d/" * 1500 + "leaf.md",  # 1,500 levels
                                  "d/" * 40 + "leaf.md",  # deeper than a note may be, but short
                                  "x" * 300])  # one name over 255 bytes
async def test_oversized_note_paths_are_clear_errors(notes_world, caplog, name, path) -> None:
    srv, task, _ = notes_world
    args = {"path": path} if name == "notes_read_file" else {"path": path, "text": "t"}
    for call in (srv.rest, srv.mcp):
        code, message = error_of(await call(name, args, task=task))
        assert code == "invalid_path" and len(message) < 600, message
    no_tracebacks(caplog)
    assert len([r for r in caplog.records if r.name.startswith(("aiohttp", "mcp"))]) == 0


# ------------------------------------------------------------------------------------------ apply_patch (§6)

async def test_apply_patch_with_a_300_byte_file_name_is_a_clear_error(tmp_path: Path, server, caplog) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    srv = await server(services_for(tmp_path, ws, ALL_ON))
    for name in ("x" * 300, "dir/" + "é" * 150 + ".txt"):
        patch = f"*** Begin Patch\n*** Add File: {name}\n+hi\n*** End Patch"
        for call in (srv.rest, srv.mcp):
            code, message = error_of(await call("apply_patch", {"patch": patch}))
            assert code == "bad_path" and "longer than 255 bytes" in message and "Nothing was changed" in message
            assert len(message) < 600
    assert list(ws.iterdir()) == []
    no_tracebacks(caplog)


# ------------------------------------------------------------------------------------------ any tool (§6)

async def test_an_unexpected_exception_in_a_tool_is_one_json_error_and_one_log_line(tmp_path: Path, server,
                                                                                     caplog) -> None:
    srv = await server(services_for(tmp_path, None))
    registry = srv.app[SERVICE_KEY].registry

    async def broken(args: Any, ctx: Any) -> Any:
        raise KeyError("argument-secret " + SECRET)

    tool = registry._all["get_context_remaining"]
    registry._all["get_context_remaining"] = dataclasses.replace(tool, execute=broken)
    caplog.set_level(logging.DEBUG)
    res = await srv.rest("get_context_remaining", {})
    code, message = error_of(res)
    assert code == "internal_error" and "KeyError" in message and "nothing was changed" in message
    assert SECRET not in message
    mres = await srv.mcp("get_context_remaining", {})
    assert error_of(mres)[0] == "internal_error"
    failures = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(failures) == 2  # one line per call
    assert all("KeyError" in r.getMessage() and "\n" not in r.getMessage() and not r.exc_info for r in failures)
    assert not [r for r in caplog.records if SECRET in r.getMessage() or "argument-secret" in r.getMessage()]
    no_tracebacks(caplog)


async def test_writer_failing_unexpectedly_says_its_effect_is_unknown(tmp_path: Path, server) -> None:
    srv = await server(services_for(tmp_path, None))
    registry = srv.app[SERVICE_KEY].registry

    async def broken(args: Any, ctx: Any) -> Any:
        raise OSError(5, "I/O error")

    tool = registry._all["notes_write_file"]
    registry._all["notes_write_file"] = dataclasses.replace(tool, execute=broken)
    code, message = error_of(await srv.rest("notes_write_file", {"path": "a.md", "text": "t"}))
    assert code == "internal_error" and "unknown" in message and "check" in message


async def test_every_http_error_is_json(tmp_path: Path, server) -> None:
    srv = await server(services_for(tmp_path, None))
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{srv.url}/no/such/route", headers=srv.headers()) as r:
            assert r.status == 404 and r.content_type == "application/json"
            assert (await r.json())["error"]["code"] == "not_found"
        async with http.get(f"{srv.url}/v1/tools/get_context_remaining", headers=srv.headers()) as r:
            assert r.status == 405 and r.content_type == "application/json"
        deep = "[" * 100_000 + "]" * 100_000
        async with http.post(f"{srv.url}/v1/tools/get_context_remaining", data=deep, headers=srv.headers()) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"
        async with http.post(f"{srv.url}/v1/tools/" + "n" * 5000, data="{}", headers=srv.headers()) as r:
            body = await r.json()
            assert r.status == 404 and len(body["error"]["message"]) < 2000


async def test_huge_unknown_field_names_give_short_messages(tmp_path: Path, server) -> None:
    srv = await server(services_for(tmp_path, None))
    res = await srv.rest("notes_read_file", {"path": "a", "k" * 100_000: 1})
    assert res.status == 400 and len(res.body["error"]["message"]) < 2000
    mres = await srv.mcp("notes_read_file", {"path": "a", "k" * 100_000: 1})
    assert mres.is_error and len(mres.text) < 2000


# ------------------------------------------------------------------------------------------ workspace (§14)

async def test_without_a_workspace_file_and_shell_tools_refuse_and_say_how(tmp_path: Path, server,
                                                                           monkeypatch) -> None:
    cwd = tmp_path / "process-cwd"  # where the server process runs: never a default workspace
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    srv = await server(services_for(tmp_path, None, ALL_ON))
    calls = [("apply_patch", {"patch": "*** Begin Patch\n*** Add File: made.txt\n+x\n*** End Patch"}),
             ("exec_command", {"cmd": "touch made-by-shell"}),
             ("write_stdin", {"session_id": 1, "chars": "x\n"})]
    for name, args in calls:
        for call in (srv.rest, srv.mcp):
            for cwd_header in (None, str(cwd), "sub"):
                code, message = error_of(await call(name, args, task="t", cwd=cwd_header))
                assert code == "no_workspace", message
                assert "--workspace DIR" in message and "x-ctp-cwd" in message and message.startswith(name)
    assert list(cwd.iterdir()) == []


async def test_x_ctp_cwd_picks_a_directory_inside_the_workspace_only(tmp_path: Path, server) -> None:
    ws = tmp_path / "ws"
    (ws / "proj").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, ws / "escape")
    srv = await server(services_for(tmp_path, ws, ALL_ON))
    here = await srv.rest("exec_command", {"cmd": "pwd"}, cwd="proj")
    assert here.ok and here.details["stdout"]["text"].strip() == str(ws / "proj")
    absolute = await srv.rest("exec_command", {"cmd": "pwd"}, cwd=str(ws / "proj"))
    assert absolute.ok and absolute.details["stdout"]["text"].strip() == str(ws / "proj")
    patched = await srv.rest("apply_patch", {"patch": "*** Begin Patch\n*** Add File: a.txt\n+a\n*** End Patch"},
                             cwd="proj")
    assert patched.ok and (ws / "proj" / "a.txt").read_text() == "a\n"
    for bad in (str(elsewhere), "..", "escape", "proj/../.."):
        for call in (srv.rest, srv.mcp):
            code, message = error_of(await call("exec_command", {"cmd": "touch escaped"}, cwd=bad))
            assert code == "bad-cwd" and "outside the workspace" in message
            code, message = error_of(await call(
                "apply_patch", {"patch": "*** Begin Patch\n*** Add File: escaped\n+x\n*** End Patch"}, cwd=bad))
            assert code == "outside_workspace"
        shell_arg = await srv.rest("exec_command", {"cmd": "touch escaped", "workdir": bad})
        assert error_of(shell_arg)[0] == "bad-cwd"
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "escaped").exists()


async def test_the_tool_server_process_has_no_default_workspace(tmp_path: Path) -> None:
    """`python -m tools_server` without --workspace (as `make up` runs it from the checkout) must not
    edit the directory it was started in."""
    cwd = tmp_path / "checkout"
    cwd.mkdir()
    (cwd / "keep.txt").write_text("untouched\n")
    state = tmp_path / "state"
    from tests.support.sandbox import extra_up_args

    proc = subprocess.Popen([sys.executable, "-m", "tools_server", "--listen", "127.0.0.1:0",
                             "--state-dir", str(state),
                             *extra_up_args(["--enable", "apply_patch", "--enable", "shell"])],
                            cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port = await asyncio.to_thread(listening_port, proc, what="the tool server")
        token = StateDir.open(state).token()
        headers = {"Authorization": f"Bearer {token}"}
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                try:
                    async with http.get(url + "/healthz", headers=headers) as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                assert time.monotonic() < deadline, "the tool server did not start"
                await asyncio.sleep(0.1)
            patch = "*** Begin Patch\n*** Update File: keep.txt\n@@\n-untouched\n+edited\n*** End Patch"
            async with http.post(url + "/v1/tools/apply_patch", json={"patch": patch}, headers=headers) as r:
                body = await r.json()
            assert r.status == 200 and body["ok"] is False and body["details"]["error"] == "no_workspace"
            async with http.post(url + "/v1/tools/exec_command", json={"cmd": "touch made"}, headers=headers) as r:
                body = await r.json()
            assert body["ok"] is False and body["details"]["error"] == "no_workspace"
    finally:
        proc.terminate()
        proc.wait(30)
    assert sorted(p.name for p in cwd.iterdir()) == ["keep.txt"]
    assert (cwd / "keep.txt").read_text() == "untouched\n"


# ------------------------------------------------------------------------------------------ MCP (§15)

async def test_mcp_structured_errors_carry_code_and_explanation(tmp_path: Path, server) -> None:
    srv = await server(services_for(tmp_path, None))
    notask = await srv.mcp("notes_list_files_by_prefix", {})
    assert notask.is_error
    assert notask.structured is not None
    assert notask.structured["ok"] is False and notask.structured["error"] == "no_task"
    assert "x-ctp-task" in notask.structured["message"] and notask.structured["message"] == notask.text
    invalid = await srv.mcp("get_context_remaining", {"bogus": 1})
    assert invalid.is_error and invalid.structured is not None
    assert invalid.structured["error"] == "invalid_arguments" and "bogus" in invalid.structured["message"]
    unknown = await srv.mcp("no_such_tool", {})
    assert unknown.is_error and unknown.structured is not None
    assert unknown.structured["error"] == "unknown_tool" and "enabled tools" in unknown.structured["message"]
    from proxy.journal import Journal

    j = Journal(srv.services.state)
    task = j.create_task()
    j.close()
    fine = await srv.mcp("get_context_remaining", {}, task=task)
    # A success carries the text the model reads too: Codex CLI hands the model only structuredContent.
    assert not fine.is_error and fine.structured["ok"] is True and fine.structured["output"] == fine.text
    assert fine.structured["state"] == "unknown"
    assert "unknown" in fine.structured["output"]


async def test_mcp_lists_read_only_hints_from_the_registry(tmp_path: Path, server) -> None:
    srv = await server(services_for(tmp_path, tmp_path, ALL_ON))
    listed = {t.name: t for t in await srv.mcp_list()}
    assert set(listed) >= READ_ONLY | WRITERS
    for name, tool in listed.items():
        assert tool.annotations is not None, name
        assert tool.annotations.read_only_hint is (name in READ_ONLY), name
    registry = srv.app[SERVICE_KEY].registry
    assert {t.name for t in registry.enabled_tools() if t.read_only} == READ_ONLY


def test_tool_error_keeps_its_code_in_the_structured_error() -> None:
    res = ToolResult.from_error(ToolError("say what to do", code="no_task", details={"hint": 1}))
    assert res.structured() == {"ok": False, "error": "no_task", "message": "say what to do", "hint": 1}
    assert res.to_json() == {"ok": False, "text": "say what to do", "details": {"error": "no_task", "hint": 1}}


# ------------------------------------------------------------------------------------------ found by the fuzz test

async def test_a_lone_surrogate_in_any_argument_is_an_invalid_argument(notes_world) -> None:
    srv, task, _ = notes_world
    for name, args in (("history_read_item", {"item_id": "\ud800", "window_id": "w1"}),
                       ("notes_read_file", {"path": "a\udfff.md"}),
                       ("history_list_items", {"tool_name": "x", "agent_name": "\ud83d"})):
        res = await srv.rest(name, args, task=task)
        assert res.status == 400 and res.body["error"]["code"] == "invalid_arguments", res.body
        assert "lone surrogate" in res.body["error"]["message"]


async def test_history_search_for_a_nul_is_a_clear_error(notes_world) -> None:
    srv, task, _ = notes_world
    for call in (srv.rest, srv.mcp):
        code, message = error_of(await call("history_search_contents", {"query": "a\x00b"}, task=task))
        assert code == "invalid_arguments" and "NUL" in message


async def test_shell_workdir_too_long_for_the_file_system_is_bad_cwd(tmp_path: Path, server) -> None:
    srv = await server(services_for(tmp_path, tmp_path, ALL_ON))
    for cwd, workdir in (("x/" * 1500, None), (None, "y" * 300), (None, "z/" * 3000)):
        res = await srv.rest("exec_command", {"cmd": "true", **({"workdir": workdir} if workdir else {})}, cwd=cwd)
        code, message = error_of(res)
        assert code == "bad-cwd" and len(message) < 600, message
