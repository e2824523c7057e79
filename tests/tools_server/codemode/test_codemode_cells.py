"""The cell manager on real V8 isolates, with a local tool double behind `dispatch` so every limit of seed
004 §5.7 can be driven exactly: each limit is a test. (The real adapters are in test_codemode_rest_mcp.py.)"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from tools_server.codemode.cells import Cell, CellManager, Effects
from tools_server.codemode.engine import V8Engine
from tools_server.codemode.limits import KIB, CellLimits
from tools_server.codemode.render import render
from tools_server.registry import ToolError, ToolResult

pytestmark = pytest.mark.timeout(60)
OWNER = ("t", "/root")


class Double:
    """A tool double: records calls, blocks on `gate` when asked, answers by the arguments."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.started = 0
        self.active = 0
        self.max_active = 0
        self.changed = asyncio.Event()

    async def __call__(self, name: str, args: dict[str, Any], cell: Cell) -> ToolResult:
        self.started += 1
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        self.changed.set()
        try:
            if args.get("block"):
                await self.gate.wait()
            if args.get("raise"):
                raise RuntimeError("Traceback (most recent call last): secret /home/x/y.py")
            if args.get("fail"):
                raise ToolError("the double failed as asked", code="asked")
            return ToolResult(text="x" * int(args.get("size", 0)) or f"{name}:{args.get('i', '')}",
                              details={"i": args.get("i")})
        finally:
            self.active -= 1
            self.changed.set()


async def until(cond: Callable[[], bool], what: str, limit: float = 20.0) -> None:
    async def loop() -> None:
        while not cond():
            await asyncio.sleep(0.005)
    try:
        await asyncio.wait_for(loop(), limit)
    except TimeoutError:
        raise AssertionError(f"condition never held: {what}") from None


def manager(double: Double, **limits: Any) -> CellManager:
    lim = dataclasses.replace(CellLimits(), **limits)
    return CellManager(lim, double, lambda: V8Engine(lim.memory_limit_bytes))


async def run(m: CellManager, code: str, adapters: frozenset[str] = frozenset({"t"})) -> Cell:
    cell = m.start(OWNER, code, adapters)
    await asyncio.wait_for(cell.done.wait(), 30)
    return cell


def out(cell: Cell) -> str:
    return "".join(cell.output.chunks)


async def test_promise_all_runs_nested_calls_concurrently() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "const r = await Promise.all([1, 2, 3].map((i) => tools.t({i, block: true})));\n"
                          "print(r.map((x) => x.output).join(','));\nreturn r.length", frozenset({"t"}))
    await until(lambda: d.active == 3, "all three calls in flight at once")
    d.gate.set()
    await asyncio.wait_for(cell.done.wait(), 20)
    assert cell.state == "completed" and out(cell) == "t:1,t:2,t:3\n" and cell.result_json == "3"
    assert cell.effects is not None and cell.effects.completed == 3
    await m.close()


async def test_four_adapter_slots() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "await Promise.all([...Array(8).keys()].map((i) => tools.t({i, block: true})))",
                   frozenset({"t"}))
    await until(lambda: len(cell.calls) == 8 and d.active == 4, "8 calls received, 4 running")
    assert sum(c.state == "queued" for c in cell.calls.values()) == 4
    d.gate.set()
    await asyncio.wait_for(cell.done.wait(), 20)
    assert cell.state == "completed" and d.max_active == 4 and d.started == 8
    await m.close()


async def test_sixteen_outstanding_calls_per_cell() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "const ps = [];\n"
                          "for (let i = 0; i < 17; i++) ps.push(tools.t({i, block: true}).catch((e) => e));\n"
                          "const e = await ps[16];\nprint(e.code, e.message);\nawait Promise.all(ps)", frozenset({"t"}))
    await until(lambda: "limit-exceeded" in out(cell), "the 17th call refused")
    assert "16 nested calls are already outstanding" in out(cell) and len(cell.calls) == 16
    d.gate.set()
    await asyncio.wait_for(cell.done.wait(), 20)
    assert cell.state == "completed" and d.started == 16
    await m.close()


async def test_cumulative_arguments_per_cell() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "const big = 'a'.repeat(100 * 1024);\nfor (let i = 0; i < 3; i++) {\n"
                        "  try { await tools.t({i, big}); print('ok', i) } catch (e) { print(e.code, e.message) }\n}")
    assert cell.state == "completed"
    lines = out(cell).splitlines()
    assert lines[:2] == ["ok 0", "ok 1"] and lines[2].startswith("limit-exceeded")
    assert "262144 bytes of arguments in all" in lines[2] and d.started == 2
    await m.close()


async def test_one_argument_at_most_256_kib() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "try { await tools.t({big: 'a'.repeat(300 * 1024)}) } catch (e) { print(e.code, e.message) }")
    assert out(cell).startswith("limit-exceeded") and "allowed for one argument" in out(cell) and d.started == 0
    await m.close()


async def test_one_result_at_most_256_kib_and_the_call_is_not_run_again() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "try { await tools.t({size: 300 * 1024}) } catch (e) { print(e.code, e.message) }")
    assert "ran, but its result is" in out(cell) and d.started == 1
    assert cell.effects is not None and cell.effects.completed == 1
    await m.close()


async def test_queued_replies_have_their_own_256_kib_budget() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "const rs = await Promise.allSettled([tools.t({block: true, size: 200 * 1024}),\n"
                          "  tools.t({block: true, size: 200 * 1024})]);\n"
                          "print(rs.map((r) => r.status === 'fulfilled' ? 'ok' : r.reason.message).join('|'))",
                   frozenset({"t"}))
    await until(lambda: d.active == 2, "both calls in flight")
    d.gate.set()  # both answers arrive together: the second does not fit in the queue
    await asyncio.wait_for(cell.done.wait(), 20)
    first, second = out(cell).strip().split("|")
    assert first == "ok" and "queue of unread replies is full" in second
    assert cell.reply_bytes == 0  # released when delivered
    await m.close()


async def test_at_most_four_running_cells_per_caller() -> None:
    d = Double()
    m = manager(d)
    cells = [m.start(OWNER, "while (true) {}", frozenset()) for _ in range(4)]
    with pytest.raises(ToolError, match="you already have 4 cells running"):
        m.start(OWNER, "1", frozenset())
    assert cells[0].terminate()
    fifth = await run(m, "return 5", frozenset())
    assert fifth.state == "completed"
    await m.close()


async def test_at_most_sixteen_unread_terminal_records() -> None:
    d = Double()
    m = manager(d)
    done = [await run(m, f"return {i}", frozenset()) for i in range(17)]
    assert m.lookup(OWNER, done[0].id) is None  # the oldest unread record was dropped
    assert all(m.lookup(OWNER, c.id) is c for c in done[1:])
    await m.close()


async def test_unread_terminal_records_expire() -> None:
    d = Double()
    m = manager(d, terminal_ttl_s=0.05)
    cell = await run(m, "return 1", frozenset())
    assert m.lookup(OWNER, cell.id) is cell
    await until(lambda: m.lookup(OWNER, cell.id) is None, "the record expires")
    await m.close()


async def test_memory_limit_ends_the_cell_not_the_server() -> None:
    d = Double()
    m = manager(d, memory_limit_bytes=16 * 1024 * KIB)
    cell = await run(m, "const a = [];\nwhile (true) a.push('x'.repeat(1000) + a.length);", frozenset())
    assert cell.state == "failed" and cell.error_code == "memory-limit"
    text, details = render(cell, 40_000)
    assert text.startswith("Script failed") and "memory limit" in text and details["error"] == "memory-limit"
    # also when the allocation happens in a promise reaction, after the first drain
    later = await run(m, "await null;\nconst a = [];\nwhile (true) a.push('x'.repeat(1000) + a.length);", frozenset())
    assert later.state == "failed" and later.error_code == "memory-limit"
    assert (await run(m, "return 2", frozenset())).result_json == "2"
    await m.close()


async def test_a_failed_cell_accounts_for_its_calls_and_refuses_new_ones() -> None:
    d = Double()
    m = manager(d, adapter_slots=1)
    cell = m.start(OWNER, "for (let i = 0; i < 3; i++) tools.t({i, block: true}).catch(() => {});\n"
                          "await tools.t({fail: true})", frozenset({"t"}))
    await until(lambda: d.active == 1 and len(cell.calls) == 4, "one call running, three waiting for the slot")
    # the failing call waits for the slot too: let the first finish so the queue drains to it
    d.gate.set()
    await asyncio.wait_for(cell.done.wait(), 20)
    assert cell.state == "failed" and cell.error_code == "asked"
    assert cell.effects is not None and cell.effects.failed == 1 and cell.effects.total == 4
    text, _ = render(cell, 40_000)
    assert "Script error:\nError: the double failed as asked" in text and "Nested calls:" in text
    await m.close()


async def test_failure_cancels_queued_calls_and_leaves_dispatched_ones_unsettled() -> None:
    d = Double()
    m = manager(d, adapter_slots=2)
    cell = m.start(OWNER, "tools.t({i: 1, block: true}).catch(() => {});\nawait tools.t({});\n"
                          "[2, 3].forEach((i) => tools.t({i, block: true}).catch(() => {}));\n"
                          "throw new Error('stop here')", frozenset({"t"}))
    await asyncio.wait_for(cell.done.wait(), 20)
    assert cell.state == "failed" and cell.error == "Error: stop here (line 4)"
    assert cell.effects == Effects(completed=1, failed=0, cancelled=2, unsettled=1)
    text, details = render(cell, 40_000)
    assert "Unknown outcome: 1 nested call(s)" in text and details["calls"]["cancelled"] == 2
    assert "Nested calls: 1 completed, 0 failed, 2 cancelled, 1 unsettled" in text
    d.gate.set()
    await until(lambda: d.active == 0, "the dispatched call finishes on its own")
    assert d.started == 2  # what was never dispatched never ran, nothing ran twice
    await m.close()


async def test_a_cell_completes_only_when_every_call_settled() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "tools.t({block: true});\nreturn 'early'", frozenset({"t"}))
    await until(lambda: cell.program_done, "the program returned")
    assert cell.state == "running"  # a floating call is still tracked
    d.gate.set()
    await asyncio.wait_for(cell.done.wait(), 20)
    assert cell.state == "completed" and cell.result_json == '"early"'
    await m.close()


async def test_an_unobserved_rejection_fails_the_cell_and_a_caught_one_does_not() -> None:
    d = Double()
    m = manager(d)
    floating = await run(m, "tools.t({fail: true});\nreturn 1")
    assert floating.state == "failed" and floating.error_code == "unhandled-rejection"
    caught = await run(m, "try { await tools.t({fail: true}) } catch (e) { print(e.code) }\nreturn 1")
    assert caught.state == "completed" and out(caught) == "asked\n"
    await m.close()


async def test_python_tracebacks_never_reach_the_cell() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "try { await tools.t({raise: true}) } catch (e) { print(e.code, e.message) }")
    assert "internal error (RuntimeError)" in out(cell)
    assert "Traceback" not in out(cell) and "/home/x" not in out(cell)
    await m.close()


async def test_no_ambient_authority_in_the_cell() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "print([typeof fetch, typeof require, typeof process, typeof setTimeout, typeof setInterval,\n"
                        "  typeof clearTimeout, typeof Atomics.waitAsync, typeof XMLHttpRequest,\n"
                        "  typeof Deno].join(','));\n"
                        "try { await import('fs'); print('imported') } catch (e) { print('import refused') }\n"
                        "print(Object.keys(tools).join(','))", frozenset({"t"}))
    assert out(cell) == ",".join(["undefined"] * 9) + "\nimport refused\nt\n"
    await m.close()


async def test_undeclared_tools_do_not_exist_in_the_cell() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "await tools.t({})", frozenset())
    assert cell.state == "failed" and "tools.t is not a function" in (cell.error or "") and d.started == 0
    await m.close()


async def test_terminate_stops_a_cpu_loop_inside_a_promise_reaction_without_blocking_the_loop() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "await tools.t({});\nwhile (true) {}", frozenset({"t"}))
    await until(lambda: d.started == 1 and d.active == 0, "the call answered, the cell spins")
    # the event loop keeps serving other work while the isolate spins: a whole other cell runs to the end
    other = await run(m, "return 'meanwhile'", frozenset())
    assert other.result_json == '"meanwhile"' and cell.state == "running"
    assert cell.terminate()
    assert cell.state == "terminated" and cell.done.is_set()
    text, _ = render(cell, 40_000)
    assert text.startswith("Script terminated\nWall time ")
    await m.close()


async def test_previews_have_their_own_budgets() -> None:
    d = Double()
    m = manager(d, output_preview_bytes=1000)
    cell = await run(m, "print('o'.repeat(5000));\nreturn 'r'.repeat(40 * 1024)", frozenset())
    text, details = render(cell, 1_000_000)
    assert details["clipping"] == {"output": True, "result": True, "error": False}
    assert cell.output.total_bytes == 5001 and "result" not in details
    failed = await run(m, "throw new Error('e'.repeat(10000))", frozenset())
    text, details = render(failed, 1_000_000)
    assert details["clipping"]["error"] and len(text.split("Script error:\n")[1]) < 4 * 1024 + 100
    await m.close()


async def test_output_is_read_once_per_observation() -> None:
    d = Double()
    m = manager(d)
    cell = m.start(OWNER, "print('first');\nawait tools.t({block: true});\nprint('second')", frozenset({"t"}))
    await until(lambda: "first" in out(cell), "first output")
    text, _ = render(cell, 40_000)
    assert text.startswith(f"Script running with cell ID {cell.id}\n") and text.endswith("Output:\nfirst\n")
    d.gate.set()
    await asyncio.wait_for(cell.done.wait(), 20)
    text, _ = render(cell, 40_000)
    assert text.startswith("Script completed\n") and text.endswith("Output:\nsecond\n")
    await m.close()


async def test_a_cell_that_replaces_builtins_does_not_break_the_host() -> None:
    d = Double()
    m = manager(d)
    cell = await run(m, "Array.prototype.join = () => 'garbage';\nArray.prototype.push = () => 0;\n"
                        "JSON.stringify = () => '!';\nprint('x', 1);\nawait tools.t({i: 2});\nreturn 1")
    assert cell.state == "completed" and out(cell) == "x 1\n" and cell.result_json == "1" and d.started == 1
    await m.close()


# -- caps belong to callers (seed 004 defect 9) --------------------------------------------------------------

async def test_one_caller_cannot_fill_the_running_cells_or_slots_of_another() -> None:
    d = Double()
    m = manager(d)
    x, y = ("t", "/x"), ("t", "/y")
    stuck = [m.start(x, "await tools.t({block: true})", frozenset({"t"})) for _ in range(4)]
    await until(lambda: d.active == 4, "x's four nested calls hold x's four slots")
    with pytest.raises(ToolError) as refused:
        m.start(x, "return 1", frozenset())
    assert refused.value.code == "too-many-cells" and "you already have 4" in refused.value.message
    other = m.start(y, "return await tools.t({i: 'y'})", frozenset({"t"}))  # y's cell and its nested call run
    await asyncio.wait_for(other.done.wait(), 20)
    assert other.state == "completed" and other.result_json is not None
    for cell in stuck:
        assert cell.terminate()
    await m.close()


async def test_one_caller_cannot_evict_another_callers_unread_result_and_eviction_says_why() -> None:
    d = Double()
    m = manager(d)
    x, y = ("t", "/x"), ("t", "/y")
    mine = await run_as(m, x, "return 'x result'")
    ys = [await run_as(m, y, f"return {i}") for i in range(20)]
    assert m.lookup(x, mine.id) is mine  # y's twenty unread results evicted only y's own oldest
    assert m.lookup(y, ys[0].id) is None and m.lookup(y, ys[-1].id) is ys[-1]
    why = m.why_gone(y, ys[0].id)
    assert why is not None and "more than 16 finished cells it had not read" in why
    assert m.why_gone(x, ys[0].id) is None  # another caller learns nothing of it
    await m.close()


async def test_a_running_cell_has_a_wall_clock_limit() -> None:
    d = Double()
    m = manager(d, max_wall_time_s=0.5)
    cell = m.start(OWNER, "print('before the loop'); while (true) {}", frozenset())
    await asyncio.wait_for(cell.done.wait(), 30)
    assert cell.state == "terminated" and cell.expired
    text, details = render(cell, 40_000)
    assert "wall-clock limit" in text and details["stopped_by"] == "wall-time-limit"
    assert "before the loop" in text  # what it printed is kept
    await m.close()


async def run_as(m: CellManager, owner: tuple[str, str], code: str) -> Cell:
    cell = m.start(owner, code, frozenset())
    await asyncio.wait_for(cell.done.wait(), 30)
    return cell
