"""exec / wait end to end: real isolates, real shells and the real patch executor, through the tool server's
REST endpoint (aiohttp client) and MCP (the official `mcp` client over streamable HTTP)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

pytestmark = pytest.mark.timeout(120)

ON = {"code_mode.enabled": True, "shell.enabled": True, "apply_patch.enabled": True}
PATCH = "*** Begin Patch\n*** Add File: made.txt\n+made by a cell\n*** End Patch\n"


async def test_off_by_default_and_listed_when_on(tool_server: Any) -> None:
    off = await tool_server()
    assert not {"exec", "wait"} & {s["name"] for s in await off.list_rest()}
    res = await off.rest("exec", {"code": "1"})
    assert res.status == 404
    on = await tool_server(ON)
    specs = {s["name"]: s for s in await on.list_rest()}
    assert specs["exec"]["parameters"]["required"] == ["code"] and "tools.exec_command" in specs["exec"]["description"]
    custom = {s["name"]: s for s in await on.list_rest("custom")}
    assert custom["exec"]["type"] == "custom" and custom["exec"]["format"]["syntax"] == "lark"
    assert specs["wait"]["parameters"]["required"] == ["cell_id"]


async def test_rest_cell_runs_shell_commands_concurrently(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    code = ("const rs = await Promise.all(['echo one', 'echo two'].map((cmd) => tools.exec_command({cmd})));\n"
            "for (const r of rs) print(r.stdout.text.trim(), r.exit_code);\nreturn rs.length")
    res = await srv.rest("exec", {"code": code}, task="t", agent="/root")
    assert res.ok, res.body
    assert res.text.startswith("Script completed\nWall time ") and "Output:\none 0\ntwo 0\n" in res.text
    assert res.text.endswith("Result:\n2") and res.details["calls"]["completed"] == 2 and res.details["result"] == 2


async def test_shell_started_by_a_failed_cell_keeps_running_and_write_stdin_continues_it(
        tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    code = ("const r = await tools.exec_command({cmd: 'cat', yield_time_ms: 250});\n"
            "print('session', r.session_id);\nthrow new Error('after starting a shell')")
    res = await srv.rest("exec", {"code": code}, task="t", agent="/root")
    assert not res.ok and res.text.startswith("Script failed")
    assert "Script error:\nError: after starting a shell (line 3)" in res.text
    sid = res.details["shells"][0]["session_id"]
    assert res.details["shells"][0]["running"] and f"Shells still running: {sid}" in res.text
    more = await srv.rest("write_stdin", {"session_id": sid, "chars": "still here\n", "closeStdin": True,
                                          "yield_time_ms": 3000}, task="t", agent="/root")
    assert more.ok and more.details["stdout"]["text"] == "still here\n" and more.details["exit_code"] == 0


async def test_nested_apply_patch_needs_confirmation_and_headless_refuses_before_any_change(
        tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    code = f"try {{ await tools.apply_patch({{patch: {json.dumps(PATCH)}}}) }} catch (e) {{ print(e.code) }}"
    res = await srv.rest("exec", {"code": code})
    assert res.ok and "Output:\napproval-unavailable\n" in res.text
    assert not (tmp_path / "made.txt").exists()
    bad = await srv.rest("exec", {"code": "try { await tools.apply_patch({patch: 'nonsense'}) } "
                                          "catch (e) { print(e.code) }"})
    assert "approval-unavailable" not in bad.text  # a wrong patch is an argument error, asked nothing
    always = await tool_server({**ON, "code_mode.approval_mode": "always"}, workspace=tmp_path / "w2")
    res = await always.rest("exec", {"code": f"const r = await tools.apply_patch({{patch: {json.dumps(PATCH)}}});\n"
                                             "print(r.ok)"})
    assert res.ok and "Output:\ntrue\n" in res.text
    assert (tmp_path / "w2" / "made.txt").read_text() == "made by a cell\n"


async def test_nested_calls_are_validated_against_the_direct_tools_schemas(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    res = await srv.rest("exec", {"code": "try { await tools.exec_command({cmd: 'touch x', bogus: 1}) } "
                                          "catch (e) { print(e.code, e.message) }"})
    assert res.ok and "unknown field" in res.text and not (tmp_path / "x").exists()


async def test_uses_rules(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server({**ON, "apply_patch.enabled": False}, workspace=tmp_path)
    unknown = await srv.rest("exec", {"code": "print(1)", "uses": ["exec_command", "rm_rf"]})
    assert not unknown.ok and unknown.body["details"]["error"] == "unknown-adapter" and "rm_rf" in unknown.text
    off = await srv.rest("exec", {"code": "print(1)", "uses": ["apply_patch"]})
    assert not off.ok and off.body["details"]["error"] == "unavailable"
    none = await srv.rest("exec", {"code": "print(Object.keys(tools).length)", "uses": []})
    assert none.ok and "Output:\n0\n" in none.text
    snapshot = await srv.rest("exec", {"code": "print(Object.keys(tools).sort().join(','))"})
    names = snapshot.text.split("Output:\n")[1].strip().split(",")
    assert "exec_command" in names and "notes_read_file" in names and "history_search_contents" in names
    assert "apply_patch" not in names and "notes_write_file" not in names and "exec" not in names


async def test_read_only_notes_tool_from_a_cell(tool_server: Any, tmp_path: Path) -> None:
    from proxy.app.journal_views import new_task

    srv = await tool_server(ON, workspace=tmp_path)
    task = new_task(srv.services.state)
    written = await srv.rest("notes_write_file", {"path": "plan.md", "text": "step one\n"}, task=task,
                             agent="/root")
    assert written.ok, written.body
    code = ("const list = await tools.notes_list_files_by_prefix({});\n"
            "const hit = await tools.notes_search_contents({query: 'step'});\nprint(list.ok, hit.ok);\n"
            "print(hit.output.includes('plan.md'))")
    res = await srv.rest("exec", {"code": code}, task=task, agent="/root")
    assert res.ok and "Output:\ntrue true\ntrue\n" in res.text, res.text


async def test_pragma_errors_before_start_and_pragma_yield(tool_server: Any) -> None:
    srv = await tool_server(ON)
    bad = await srv.rest("exec", {"code": '// @exec: {"nope": 1}\nprint(1)'})
    assert not bad.ok and bad.body["details"]["error"] == "invalid-pragma" and "got `nope`" in bad.text
    conflict = await srv.rest("exec", {"code": '// @exec: {"yield_time_ms": 300}\nprint(1)', "yield_time_ms": 400})
    assert not conflict.ok and "conflicts" in conflict.text
    spin = await srv.rest("exec", {"code": '// @exec: {"yield_time_ms": 300}\nprint("up");\nwhile (true) {}'})
    assert spin.ok and spin.text.startswith(f"Script running with cell ID {spin.details['cell_id']}\n")
    stopped = await srv.rest("wait", {"cell_id": spin.details["cell_id"], "terminate": True})
    assert stopped.text.startswith("Script terminated")


async def test_a_spinning_cell_does_not_block_the_server_and_wait_terminate_stops_it(tool_server: Any) -> None:
    srv = await tool_server(ON)
    spin = await srv.rest("exec", {"code": "while (true) {}", "yield_time_ms": 250})
    cell_id = spin.details["cell_id"]
    assert spin.ok and spin.details["status"] == "running" and spin.text.endswith("Output:\n")
    # while it spins, the server answers other calls: another cell runs to its end
    other = await srv.rest("exec", {"code": "return 6 * 7"})
    assert other.ok and other.details["result"] == 42
    still = await srv.rest("wait", {"cell_id": cell_id, "yield_time_ms": 250})
    assert still.details["status"] == "running" and still.text.endswith("Output:\n")
    stopped = await srv.rest("wait", {"cell_id": cell_id, "terminate": True})
    assert stopped.ok and stopped.text.startswith("Script terminated\nWall time ")
    gone = await srv.rest("wait", {"cell_id": cell_id})
    assert not gone.ok and gone.body["details"]["error"] == "unknown-cell"


async def test_cells_belong_to_their_caller(tool_server: Any) -> None:
    srv = await tool_server(ON)
    spin = await srv.rest("exec", {"code": "while (true) {}", "yield_time_ms": 250}, task="a", agent="/root")
    other = await srv.rest("wait", {"cell_id": spin.details["cell_id"], "terminate": True}, task="b", agent="/root")
    assert not other.ok and other.body["details"]["error"] == "unknown-cell"
    mine = await srv.rest("wait", {"cell_id": spin.details["cell_id"], "terminate": True}, task="a", agent="/root")
    assert mine.text.startswith("Script terminated")


async def test_wait_returns_the_result_once(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    res = await srv.rest("exec", {"code": "const r = await tools.exec_command({cmd: 'sleep 1; echo late'});\n"
                                          "print(r.stdout.text)", "yield_time_ms": 250})
    assert res.details["status"] == "running"
    done = await srv.rest("wait", {"cell_id": res.details["cell_id"], "yield_time_ms": 10000})
    assert done.ok and done.text.startswith("Script completed") and "late" in done.text
    again = await srv.rest("wait", {"cell_id": res.details["cell_id"]})
    assert not again.ok and again.body["details"]["error"] == "unknown-cell"


async def test_rest_client_hanging_up_on_exec_stops_the_cell(tool_server: Any) -> None:
    srv = await tool_server(ON)
    async with aiohttp.ClientSession() as http:
        task = asyncio.ensure_future(http.post(f"{srv.url}/v1/tools/exec", headers=srv.headers(),
                                               data=json.dumps({"code": "while (true) {}", "yield_time_ms": 30000})))
        registry = srv.services.extras["registry"]
        manager = next(f for f in registry.families if f.name == "code_mode").manager

        async def running() -> None:
            while manager.running() != 1:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(running(), 20)
        task.cancel()

        async def stopped() -> None:
            while manager.running() != 0:
                await asyncio.sleep(0.01)
        await asyncio.wait_for(stopped(), 20)


async def test_mcp_exec_and_wait(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    tools = {t.name: t for t in await srv.mcp_list()}
    assert {"exec", "wait"} <= set(tools)
    res = await srv.mcp("exec", {"code": "const r = await tools.exec_command({cmd: 'printf mcp'});\n"
                                         "print(r.stdout.text);\nreturn {n: 1}"}, task="t", agent="/root")
    assert not res.is_error and res.text.startswith("Script completed") and "Output:\nmcp\n" in res.text
    assert res.structured is not None and res.structured["result"] == {"n": 1}
    spin = await srv.mcp("exec", {"code": "while (true) {}", "yield_time_ms": 250}, task="t", agent="/root")
    cell_id = spin.structured["cell_id"] if spin.structured else ""
    stop = await srv.mcp("wait", {"cell_id": cell_id, "terminate": True}, task="t", agent="/root")
    assert stop.text.startswith("Script terminated")
    failed = await srv.mcp("exec", {"code": "null.x"})
    assert failed.is_error and "Script error:\nTypeError" in failed.text and "Traceback" not in failed.text


async def test_a_tool_switched_off_after_the_cell_started_is_refused_at_dispatch(tool_server: Any,
                                                                                   tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    manager = next(f for f in srv.services.extras["registry"].families if f.name == "code_mode").manager
    code = ("const first = await tools.exec_command({cmd: 'sleep 1', yield_time_ms: 250});\n"
            "try { await tools.exec_command({cmd: 'touch second'}) } catch (e) { print(e.code) }")
    call = asyncio.ensure_future(srv.rest("exec", {"code": code}, task="t", agent="/root"))

    async def first_call_running() -> None:
        while not any(c.calls and c.calls[min(c.calls)].state == "running" for c in manager.cells.values()):
            await asyncio.sleep(0.01)
    await asyncio.wait_for(first_call_running(), 20)
    srv.services.config.shell.enabled = False
    res = await call
    assert res.ok and "Output:\nunavailable\n" in res.text and not (tmp_path / "second").exists()


async def test_bridge_endpoint_runs_a_freeform_exec_call(tool_server: Any, tmp_path: Path) -> None:
    """What the proxy's tool bridge sends for a custom `exec` call: the raw JavaScript as `input`."""
    srv = await tool_server(ON, workspace=tmp_path)
    source = '// @exec: {"yield_time_ms": 5000}\nconst r = await tools.exec_command({cmd: "echo bridged"});\n' \
             "print(r.stdout.text.trim())"
    async with aiohttp.ClientSession() as http, http.post(
            f"{srv.url}/v1/bridge/call", headers=srv.headers(),
            data=json.dumps({"name": "exec", "kind": "custom", "input": source, "task": "t",
                             "agent": "/root"})) as resp:
        body = await resp.json()
    assert resp.status == 200 and not body["is_error"], body
    assert body["output"].startswith("Script completed\nWall time ") and body["output"].endswith("Output:\nbridged\n")
    async with aiohttp.ClientSession() as http, http.post(
            f"{srv.url}/v1/bridge/call", headers=srv.headers(),
            data=json.dumps({"name": "exec", "kind": "function",
                             "arguments": json.dumps({"code": "null.x"})})) as resp:
        failed = await resp.json()
    assert failed["is_error"] and "Script failed" in failed["output"] and "Traceback" not in failed["output"]


async def test_output_past_the_preview_is_kept_in_a_private_file(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    code = "for (let i = 0; i < 3000; i++) print(String(i).padStart(8, '0') + 'x'.repeat(91));"
    res = await srv.rest("exec", {"code": code, "max_output_tokens": 1000})
    assert res.ok and res.details["clipping"]["output"]
    rec = res.details["recovery"]["output"]
    assert rec["state"] == "complete" and rec["bytes"] == 300_000 == rec["capturedBytes"]
    path = Path(rec["path"])
    assert f"Full output (300000 bytes, complete): {path}" in res.text
    assert (path.stat().st_mode & 0o777) == 0o600
    lines = path.read_text().splitlines()
    assert len(lines) == 3000 and lines[-1].startswith("00002999")
    small = await srv.rest("exec", {"code": "print('short')"})
    assert "recovery" not in small.details  # a small result needs no file
    await srv.close()
    assert not path.exists()  # removed with the server session's other captures


# -- stopping a cell is a real stop (seed 004 defects 2, 5, 11) ---------------------------------------------

def code_family(srv: Any) -> Any:
    return next(f for f in srv.services.extras["registry"].families if f.name == "code_mode")


async def until_true(cond: Any, what: str, limit: float = 30.0) -> None:
    async def loop() -> None:
        while not cond():
            await asyncio.sleep(0.02)
    try:
        await asyncio.wait_for(loop(), limit)
    except TimeoutError:
        raise AssertionError(f"condition never held: {what}") from None


def nested_running(srv: Any, cell_id: str, name: str) -> bool:
    cell = code_family(srv).manager.cells.get(cell_id)
    return cell is not None and any(c.name == name and c.state == "running" for c in cell.calls.values())


async def test_stopping_a_cell_leaves_its_polled_shell_unread_for_write_stdin(tool_server: Any,
                                                                           tmp_path: Path) -> None:
    """Defect 2: a nested poll in flight when its cell is stopped returns before reading; the stop's answer
    says the shell is still running, and write_stdin then gets its last output and its exit code."""
    srv = await tool_server(ON, workspace=tmp_path)
    code = ("const r = await tools.exec_command({cmd: 'while [ ! -e go ]; do sleep 0.05; done; echo IMPORTANT; "
            "exit 7', yield_time_ms: 250});\nprint('sid=' + r.session_id);\n"
            "await tools.write_stdin({session_id: r.session_id, yield_time_ms: 30000});")
    res = await srv.rest("exec", {"code": code, "yield_time_ms": 250}, task="t", agent="/root")
    cell_id = res.details["cell_id"]
    await until_true(lambda: nested_running(srv, cell_id, "write_stdin"), "the nested poll to be in flight")
    stopped = await srv.rest("wait", {"cell_id": cell_id, "terminate": True}, task="t", agent="/root")
    assert stopped.text.startswith("Script terminated"), stopped.text
    (shell,) = stopped.details["shells"]
    sid = shell["session_id"]
    assert shell["running"] and f"Shells still running: {sid}" in stopped.text
    assert stopped.details["calls"]["unsettled"] == 0
    (tmp_path / "go").touch()
    more = await srv.rest("write_stdin", {"session_id": sid, "yield_time_ms": 30000}, task="t", agent="/root")
    assert more.ok, more.body
    assert "IMPORTANT" in more.details["stdout"]["text"] and more.details["exit_code"] == 7


async def test_stopping_a_cell_reports_its_exec_command_in_flight(tool_server: Any, tmp_path: Path) -> None:
    """Defect 5: an exec_command still in flight when its cell is stopped is reported with its session id,
    and write_stdin can stop it: never an orphan."""
    srv = await tool_server(ON, workspace=tmp_path)
    code = "print('before'); await tools.exec_command({cmd: 'sleep 1003', yield_time_ms: 30000})"
    res = await srv.rest("exec", {"code": code, "yield_time_ms": 250}, task="t", agent="/root")
    cell_id = res.details["cell_id"]
    shell = next(f for f in srv.services.extras["registry"].families if f.name == "shell")
    await until_true(lambda: nested_running(srv, cell_id, "exec_command") and shell.manager._jobs,
                     "the nested exec_command to have started its process")
    stopped = await srv.rest("wait", {"cell_id": cell_id, "terminate": True}, task="t", agent="/root")
    (entry,) = stopped.details["shells"]
    sid = entry["session_id"]
    assert entry["running"] and f"Shells still running: {sid}" in stopped.text, stopped.text
    assert stopped.details["calls"]["unsettled"] == 0
    ended = await srv.rest("write_stdin", {"session_id": sid, "terminate": True, "yield_time_ms": 10000},
                           task="t", agent="/root")
    assert ended.ok and ended.details["exit_code"] is not None, ended.body
    assert not shell.manager._jobs or all(j.complete.is_set() for j in shell.manager._jobs.values())


async def test_a_shell_read_to_its_exit_is_not_reported_running(tool_server: Any, tmp_path: Path) -> None:
    """Defect 11: a nested write_stdin that sees the exit code closes the shell in the cell's report."""
    srv = await tool_server(ON, workspace=tmp_path)
    code = ("const r = await tools.exec_command({cmd: 'cat', yield_time_ms: 250});\n"
            "const w = await tools.write_stdin({session_id: r.session_id, chars: 'hi\\n', closeStdin: true, "
            "yield_time_ms: 20000});\nprint('exit', w.exit_code);\nthrow new Error('stop here')")
    res = await srv.rest("exec", {"code": code, "yield_time_ms": 20000}, task="t", agent="/root")
    assert "exit 0" in res.text and res.text.startswith("Script failed"), res.text
    assert res.details["shells"] == [{"session_id": res.details["shells"][0]["session_id"], "running": False,
                                      "unread": False}]
    assert "Shells still running" not in res.text


@pytest.mark.parametrize("breaker", [
    'Object.defineProperty(Array.prototype, "0", {get() { throw new Error("evil") }})',
    "Array.prototype.push = () => { throw new Error('evil') }; Array.prototype.join = () => 'x'",
    "Map.prototype.get = () => undefined; Map.prototype.set = () => { throw new Error('evil') }",
])
async def test_a_cell_that_breaks_builtins_still_ends(tool_server: Any, tmp_path: Path, breaker: str) -> None:
    """Defect 18: a cell that breaks Array or Map builtins is never left "running" after its program ended;
    its output, nested calls and result still come back."""
    srv = await tool_server(ON, workspace=tmp_path)
    code = f"{breaker};\nprint('still printed');\nconst r = await tools.exec_command({{cmd: 'echo nested'}});\n" \
           "print(r.stdout.text.trim());\nreturn 1"
    res = await srv.rest("exec", {"code": code, "yield_time_ms": 20000}, task="t", agent="/root")
    assert res.details["status"] == "completed", res.text
    assert "still printed\nnested\n" in res.text and res.details["result"] == 1


# -- nothing printed is lost without a trace (seed 004 defects 3, 7, 8) ------------------------------------

async def test_output_past_the_call_budget_has_a_file_and_shows_the_newest(tool_server: Any, tmp_path: Path) -> None:
    """Defect 3 (output) and 7: output over the call's budget gets a recovery file named in the answer, and
    the preview shows the newest output (the last line), not only the beginning."""
    srv = await tool_server(ON, workspace=tmp_path)
    res = await srv.rest("exec", {"code": "for (let i = 0; i < 50; i++) print('y'.repeat(1000)); "
                                          "print('LAST LINE'); return 'ok'"}, task="t", agent="/root")
    assert res.ok and res.details["clipping"]["output"]
    assert "LAST LINE" in res.text.split("Output:\n", 1)[1]
    rec = res.details["recovery"]["output"]
    assert rec["state"] == "complete" and f"{rec['path']}" in res.text
    assert Path(rec["path"]).read_text().endswith("LAST LINE\n")
    late = ("for (let i = 0; i < 300; i++) print('x'.repeat(1000));\nawait tools.exec_command({cmd: 'true'});\n"
            "print('LATER-LINE'); return 'done'")
    res = await srv.rest("exec", {"code": late, "max_output_tokens": 100000, "yield_time_ms": 20000},
                         task="t", agent="/root")
    assert res.details["status"] == "completed" and "LATER-LINE" in res.text, res.text[-300:]
    assert res.details["clipping"]["output"] and "earlier bytes not shown" in res.text


async def test_a_long_result_and_a_long_error_have_files(tool_server: Any, tmp_path: Path) -> None:
    """Defect 3 (result, error): past 32 KiB and 4 KiB, the whole value is in a file the answer names."""
    srv = await tool_server(ON, workspace=tmp_path)
    res = await srv.rest("exec", {"code": "return 'r'.repeat(100000)"}, task="t", agent="/root")
    assert res.details["clipping"]["result"]
    rec = res.details["recovery"]["result"]
    assert rec["state"] == "complete" and rec["path"] in res.text
    assert Path(rec["path"]).read_text() == json.dumps("r" * 100000)
    err = await srv.rest("exec", {"code": "throw new Error('e'.repeat(10000) + 'END')"}, task="t", agent="/root")
    assert err.details["clipping"]["error"]
    rec = err.details["recovery"]["error"]
    assert rec["path"] in err.text and Path(rec["path"]).read_text().startswith("Error: eee")
    assert "END" in Path(rec["path"]).read_text()


async def test_output_before_a_cpu_loop_is_kept_when_the_cell_is_stopped(tool_server: Any) -> None:
    """Defect 8: what a cell printed before it spun is in the stop's answer."""
    srv = await tool_server(ON)
    spin = await srv.rest("exec", {"code": "print('small'); while (true) {}", "yield_time_ms": 250},
                          task="t", agent="/root")
    assert spin.details["status"] == "running"
    stopped = await srv.rest("wait", {"cell_id": spin.details["cell_id"], "terminate": True}, task="t",
                             agent="/root")
    assert stopped.text.startswith("Script terminated") and "Output:\nsmall\n" in stopped.text, stopped.text


async def test_a_flood_of_synchronous_output_is_bounded_and_said(tool_server: Any) -> None:
    """Defect 8: 100 MB printed in one synchronous loop does not kill the cell at its memory limit with
    nothing kept: the producer credit bounds what waits in the isolate, the rest is counted and said, and
    the recovery file is marked partial (overload)."""
    srv = await tool_server(ON)
    res = await srv.rest("exec", {"code": "for (let i = 0; i < 100000; i++) print('x'.repeat(1000)); "
                                          "print('END'); return 1", "yield_time_ms": 30000},
                         task="t", agent="/root")
    assert res.details["status"] == "completed", res.text[:500]
    assert res.details["output_bytes"] > 0 and "were not kept" in res.text
    rec = res.details["recovery"]["output"]
    assert rec["state"] == "partial" and rec["reason"] == "overload" and Path(rec["path"]).exists()


async def test_a_hung_up_exec_stops_the_shells_its_cell_started(tool_server: Any, tmp_path: Path) -> None:
    """seed004 N6: nobody learnt the cell's ID, so nobody can name its shells: they are stopped with it."""
    srv = await tool_server({**ON, "shell.enabled": True}, workspace=tmp_path)
    shells = srv.services.extras["shell.family"].manager
    code = ("await tools.exec_command({cmd: 'sleep 1061', yield_time_ms: 250});\n"
            "await new Promise(() => {})")
    async with aiohttp.ClientSession() as http:
        task = asyncio.ensure_future(http.post(f"{srv.url}/v1/tools/exec", headers=srv.headers("t", "/root"),
                                               data=json.dumps({"code": code, "yield_time_ms": 30000})))

        async def until(check: Any) -> None:
            while not check():
                await asyncio.sleep(0.02)
        await asyncio.wait_for(until(lambda: any(not j.settled for j in shells._jobs.values())), 30)
        job = next(iter(shells._jobs.values()))
        task.cancel()
        await asyncio.wait_for(until(lambda: job.settled and not shells._jobs), 30)
    assert job.stop_requested


async def test_a_cell_that_replaces_promise_then_still_ends_with_its_result(tool_server: Any) -> None:
    """seed004 N7: the host attaches the program's completion with the `then` it captured at start."""
    srv = await tool_server(ON)
    res = await srv.rest("exec", {"code": "Promise.prototype.then = function () { return this }; return 1",
                                  "yield_time_ms": 20000})
    assert res.ok and res.text.startswith("Script completed"), res.body
    assert res.details["result"] == 1
