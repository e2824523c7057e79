"""Code mode's limits hold (issue 33): a cell's memory limit covers every allocation, ArrayBuffers included,
and a cell that never yields is stopped by its CPU time or wall-clock limit; the server stays up and the
next cell works. Each cell's isolate runs in a worker process (tools_server/codemode/process.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

from tools_server.codemode.cells import Cell, CellManager
from tools_server.codemode.limits import CellLimits
from tools_server.codemode.process import ProcessEngine, WorkerPool, reap
from tools_server.registry import ToolResult

pytestmark = pytest.mark.timeout(180)
ON = {"code_mode.enabled": True, "shell.enabled": True}
OWNER = ("t", "/root")


async def test_an_arraybuffer_past_the_limit_is_the_cells_memory_limit_and_the_server_carries_on(
        tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    big = await srv.rest("exec", {"code": "const b = new ArrayBuffer(2 ** 31);\nreturn b.byteLength"})
    assert not big.ok and big.text.startswith("Script failed") and big.details["error"] == "memory-limit"
    assert "memory limit" in big.text and "ArrayBuffers included" in big.text
    many = await srv.rest("exec", {"code": "const keep = [];\nfor (let i = 0; i < 40; i++) {\n"
                                           "  const b = new ArrayBuffer(100 * 1024 * 1024);\n"
                                           "  new Uint8Array(b).fill(1);\n  keep.push(b);\n}\nreturn keep.length"})
    assert not many.ok and many.details["error"] == "memory-limit"
    # the server answers, and the next cell works (and still reaches the shell through the one road)
    assert (await srv.rest("get_context_remaining", {}, task="t", agent="/root")).status == 200
    after = await srv.rest("exec", {"code": "const r = await tools.exec_command({cmd: 'echo still here'});\n"
                                            "print(r.stdout.text.trim());\nreturn new ArrayBuffer(1024).byteLength"})
    assert after.ok and "Output:\nstill here\n" in after.text and after.details["result"] == 1024


async def test_a_cell_that_catches_the_refusal_stays_below_its_limit(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(ON, workspace=tmp_path)
    res = await srv.rest("exec", {"code": "try { new Uint8Array(2 ** 30) } catch (e) { print(e.name, e.message) }\n"
                                          "return 1"})
    assert res.ok and "Output:\nRangeError Array buffer allocation failed\n" in res.text


async def _dispatch(name: str, args: dict[str, Any], cell: Cell) -> ToolResult:
    return ToolResult(text=f"{name} ran", details={})


async def _run(lim: CellLimits, code: str) -> tuple[Cell, CellManager, WorkerPool]:
    pool = WorkerPool(lim.memory_limit_bytes, lim.max_cpu_time_s, spares=0)
    manager = CellManager(lim, _dispatch, lambda: ProcessEngine(pool))
    cell = manager.start(OWNER, code, frozenset({"t"}))
    await asyncio.wait_for(cell.done.wait(), 120)
    return cell, manager, pool


async def test_a_cell_that_never_yields_is_stopped_by_its_cpu_time_limit() -> None:
    lim = dataclasses.replace(CellLimits(), max_cpu_time_s=1, max_wall_time_s=600)
    cell, manager, pool = await _run(lim, "while (true) {}")
    assert cell.state == "failed" and cell.error_code == "cpu-limit" and "CPU time limit (1 s)" in (cell.error or "")
    after = manager.start(OWNER, "return (await tools.t({})).output", frozenset({"t"}))
    await asyncio.wait_for(after.done.wait(), 120)
    assert after.state == "completed" and after.result_json == '"t ran"'
    await manager.close()
    await pool.close()


async def test_a_cell_that_never_yields_is_stopped_by_its_wall_clock_limit_and_keeps_what_it_printed() -> None:
    lim = dataclasses.replace(CellLimits(), max_cpu_time_s=0, max_wall_time_s=2)
    cell, manager, pool = await _run(lim, "print('before the loop');\nwhile (true) {}")
    assert cell.state == "terminated" and cell.expired
    assert "before the loop" in cell.output.read_unread()
    await manager.close()
    await pool.close()


async def test_closing_a_cell_kills_its_worker_and_a_closed_pool_leaves_no_process() -> None:
    lim = CellLimits()
    pool = WorkerPool(lim.memory_limit_bytes, lim.max_cpu_time_s, spares=1)
    manager = CellManager(lim, _dispatch, lambda: ProcessEngine(pool))
    cell = manager.start(OWNER, "while (true) {}", frozenset())
    engine = cell.engine
    assert isinstance(engine, ProcessEngine)

    async def booted() -> None:
        while engine._worker is None:
            await asyncio.sleep(0.01)
    await asyncio.wait_for(booted(), 60)
    assert engine._worker is not None
    pid = engine._worker.proc.pid
    assert cell.terminate()
    await manager.close()
    await pool.close()
    await reap()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_status_says_what_the_memory_limit_covers_here(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from proxy.app.status import capability_status
    from proxy.config import Config
    from tools_server.codemode.process import covers_array_buffers

    config = Config()
    config.code_mode.enabled = True
    st = capability_status(config, "code_mode")
    assert st.state == "active" and "memory limit 64 MiB each (V8 heap and ArrayBuffers" in st.reason
    assert covers_array_buffers("linux") and not covers_array_buffers("darwin")
    monkeypatch.setattr(sys, "platform", "darwin")  # RLIMIT_DATA does not bound mmap there: never claimed
    st = capability_status(config, "code_mode")
    assert "memory limit 64 MiB of V8 heap each (ArrayBuffers are not bounded on darwin)" in st.reason
