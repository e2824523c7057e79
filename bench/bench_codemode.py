"""Code mode and tool discovery: cell start-up, a tool round trip from a cell against the direct REST call,
an isolate's memory, and the tool-definition bytes a model receives. All ratios are measured in one run.

    .venv/bin/python bench/bench_codemode.py [--rounds 60] [--quick]

Against the tool server app started in-process on a loopback port (aiohttp runner, keep-alive client):
1. Cell start-up: `POST /v1/tools/exec {"code": "return 1"}` (a fresh V8 isolate booted, run, closed) against
   `POST /v1/tools/get_context_remaining` (the cheapest direct tool) on the same server.
2. Start-to-first-dispatch: from the exec request to the moment the cell's first nested call reaches its tool
   (timed inside the server), median.
3. Round trips: one `notes_list_files_by_prefix` call over REST, against one `exec` whose cell makes that call;
   and ten sequential calls over REST against one cell making the ten calls (per-call cost inside a cell).
4. Memory: V8 heap used by one booted isolate, and the process RSS growth per live isolate (16 isolates).
5. Tool-definition bytes (JSON of the function specs) with every family enabled: all tools, discovery on with
   the default deferred set (a new session), and code mode (`exec` + `wait` only).
6. A scripted task through `ctproxy up --bridge code_mode,history,notes` (the emulator plays the model):
   search the history, read the three items found, write a note. Direct tools (search; three reads in one turn;
   the write) against one code-mode cell (search and three reads) and the write: upstream rounds and the
   bytes of every request body the upstream received.
7. Engines (issue 33): a trivial cell (`return 1`) through the cell manager, in-process V8 (the isolate in the
   server, its ArrayBuffers unbounded) against the worker process code mode uses now (RLIMIT_DATA/RLIMIT_CPU):
   with its booted spare ready, back to back (the spare still booting), and cold (no spare).
   `--engines-only` runs just this part.
Absolute figures depend on the machine; compare the ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp import web

from bench.common import print_table, ratio, summarize, write_result
from proxy.app.journal_views import new_task
from proxy.capabilities import TABLE
from proxy.config import Config
from proxy.state import StateDir
from tools_server.app import SERVICE_KEY, bind_port, create_app
from tools_server.codemode.cells import CellManager
from tools_server.codemode.engine import V8Engine
from tools_server.codemode.limits import CellLimits
from tools_server.codemode.process import ProcessEngine, WorkerPool
from tools_server.registry import Services


def _services(root: Path, everything: bool = False) -> Services:
    config = Config()
    config.code_mode.enabled = True
    if everything:
        for cap in TABLE:
            section = getattr(config, cap.name)
            if "enabled" in type(section).model_fields:
                section.enabled = True
    workspace = root / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    return Services(config=config, state=StateDir.open(root / "state"), workspace=workspace)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _serve(services: Services) -> tuple[web.AppRunner, str, str, web.Application]:
    token = services.state.token()
    app = create_app(services, token=token, listen_host="127.0.0.1", port=None)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    bind_port(app, port)
    return runner, f"http://127.0.0.1:{port}", token, app


async def _timed(http: aiohttp.ClientSession, url: str, headers: dict[str, str], name: str,
                 args: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with http.post(f"{url}/v1/tools/{name}", data=json.dumps(args), headers=headers) as resp:
        body = await resp.json()
    elapsed = time.perf_counter() - started
    if resp.status != 200 or not body.get("ok"):
        raise RuntimeError(f"{name} failed: {str(body)[:300]}")
    return elapsed


def _spec_bytes(specs: list[dict[str, Any]]) -> int:
    return len(json.dumps(specs, separators=(",", ":")).encode())


async def definition_bytes(root: Path) -> dict[str, Any]:
    services = _services(root / "defs", everything=True)
    services.config.tool_discovery.enabled = True
    runner, _, _, app = await _serve(services)
    try:
        registry = app[SERVICE_KEY].registry
        specs = {t.name: t.function_spec() for t in registry.enabled_tools()}
        all_tools = [s for n, s in specs.items() if n != "find_tools"]
        discovery = services.extras["discovery.family"]
        carried = [specs[n] for n in discovery.carried_tool_names("session:bench-new")]
        code_only = [registry.get("exec").custom_spec() or specs["exec"], specs["wait"]]  # type: ignore[union-attr]
        return {"tools_all": len(all_tools), "bytes_all": _spec_bytes(all_tools),
                "tools_discovery": len(carried), "bytes_discovery": _spec_bytes(carried),
                "bytes_code_mode": _spec_bytes(code_only)}
    finally:
        await runner.cleanup()


async def memory() -> dict[str, Any]:
    probe = V8Engine(64 * 1024 * 1024)
    await probe.boot(["exec_command"])
    heap = probe.heap_used()
    probe.close()
    before = _rss_bytes()
    engines = []
    for _ in range(16):
        engine = V8Engine(64 * 1024 * 1024)
        await engine.boot(["exec_command"])
        engines.append(engine)
    grown = _rss_bytes() - before
    for engine in engines:
        engine.close()
    return {"heap_used_bytes": heap, "rss_per_isolate_bytes": grown // 16}


async def run(rounds: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ctp-bench-codemode-"))
    services = _services(root / "main")
    runner, url, token, app = await _serve(services)
    task = new_task(services.state)
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}
    family = next(f for f in app[SERVICE_KEY].registry.families if f.name == "code_mode")
    first_dispatch: list[float] = []
    real_dispatch = family.manager.dispatch

    async def timing_dispatch(name: str, args: dict[str, Any], cell: Any) -> Any:
        if not cell.calls or min(cell.calls) == max(cell.calls):
            first_dispatch.append(time.perf_counter())
        return await real_dispatch(name, args, cell)

    family.manager.dispatch = timing_dispatch
    one_call = {"code": "await tools.notes_list_files_by_prefix({}); return 1"}
    ten_calls = {"code": "for (let i = 0; i < 10; i++) await tools.notes_list_files_by_prefix({});\nreturn 10"}
    samples: dict[str, list[float]] = {k: [] for k in ("exec_empty", "direct_cheapest", "rest_one", "cell_one",
                                                        "rest_ten", "cell_ten", "to_first_dispatch")}
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(5):  # warm up: the first isolate in a process costs more
                await _timed(http, url, headers, "exec", {"code": "return 1"})
            for r in range(rounds):
                order = ["exec_empty", "direct_cheapest", "rest_one", "cell_one", "rest_ten", "cell_ten"]
                shift = r % len(order)
                for key in order[shift:] + order[:shift]:
                    if key == "exec_empty":
                        samples[key].append(await _timed(http, url, headers, "exec", {"code": "return 1"}))
                    elif key == "direct_cheapest":
                        samples[key].append(await _timed(http, url, headers, "get_context_remaining", {}))
                    elif key == "rest_one":
                        samples[key].append(await _timed(http, url, headers, "notes_list_files_by_prefix", {}))
                    elif key == "rest_ten":
                        started = time.perf_counter()
                        for _ in range(10):
                            await _timed(http, url, headers, "notes_list_files_by_prefix", {})
                        samples[key].append(time.perf_counter() - started)
                    else:
                        first_dispatch.clear()
                        started = time.perf_counter()
                        await _timed(http, url, headers, "exec", one_call if key == "cell_one" else ten_calls)
                        samples[key].append(time.perf_counter() - started)
                        if key == "cell_one" and first_dispatch:
                            samples["to_first_dispatch"].append(first_dispatch[0] - started)
    finally:
        await runner.cleanup()
    stats = {k: summarize(v) for k, v in samples.items()}
    med = {k: s.median for k, s in stats.items()}
    return {
        "rounds": rounds,
        "latency_ms": {k: s.ms() for k, s in stats.items()},
        "ratios": {
            "exec_empty_vs_direct_cheapest": round(ratio(med["exec_empty"], med["direct_cheapest"]), 2),
            "cell_one_call_vs_rest_one_call": round(ratio(med["cell_one"], med["rest_one"]), 2),
            "cell_ten_calls_vs_rest_ten_calls": round(ratio(med["cell_ten"], med["rest_ten"]), 2),
        },
        "memory": await memory(),
        "tool_definitions": await definition_bytes(root),
        "scenario": await scenario(),
        "engines": await engines(max(5, rounds // 4)),
    }


async def engines(rounds: int) -> dict[str, Any]:
    """A trivial cell, start to end, in-process against a worker process (spare ready, back to back, cold)."""
    from tools_server.registry import ToolResult

    async def dispatch(name: str, args: dict[str, Any], cell: Any) -> ToolResult:
        return ToolResult(text="", details={})

    lim = CellLimits()
    warm_pool = WorkerPool(lim.memory_limit_bytes, lim.max_cpu_time_s, spares=1)
    cold_pool = WorkerPool(lim.memory_limit_bytes, lim.max_cpu_time_s, spares=0)
    managers = {"in_process": CellManager(lim, dispatch, lambda: V8Engine(lim.memory_limit_bytes)),
                "worker_spare_ready": CellManager(lim, dispatch, lambda: ProcessEngine(warm_pool)),
                "worker_back_to_back": CellManager(lim, dispatch, lambda: ProcessEngine(warm_pool)),
                "worker_cold": CellManager(lim, dispatch, lambda: ProcessEngine(cold_pool))}
    samples: dict[str, list[float]] = {k: [] for k in managers}

    async def one(key: str) -> float:
        started = time.perf_counter()
        cell = managers[key].start(("bench", "/root"), "return 1", frozenset())
        await asyncio.wait_for(cell.done.wait(), 120)
        if cell.state != "completed":
            raise RuntimeError(f"{key}: the trivial cell ended {cell.state}: {cell.error}")
        return time.perf_counter() - started

    try:
        await one("worker_spare_ready")  # the first one boots the pool
        for _ in range(rounds):
            for key in ("in_process", "worker_spare_ready", "worker_back_to_back", "worker_cold"):
                if key == "worker_spare_ready" and warm_pool._spare is not None:
                    await asyncio.shield(warm_pool._spare)  # its spare has booted
                samples[key].append(await one(key))
                if key == "worker_back_to_back":
                    samples[key].append(await one(key))  # right after: the spare taken a moment ago still boots
    finally:
        for m in managers.values():
            await m.close()
        await warm_pool.close()
        await cold_pool.close()
    stats = {k: summarize(v) for k, v in samples.items()}
    med = {k: s.median for k, s in stats.items()}
    return {"latency_ms": {k: s.ms() for k, s in stats.items()},
            "ratios": {f"{k}_vs_in_process": round(ratio(med[k], med["in_process"]), 2)
                       for k in med if k != "in_process"}}


SEARCH = {"query": "alpha fact"}
WRITE = {"path": "summary.md", "text": "the three alpha facts, summarized\n"}
CELL = ("const hits = await tools.history_search_contents({query: 'alpha fact'});\n"
        "const found = hits.output.split('\\n').filter((l) => l.startsWith('{')).map((l) => JSON.parse(l));\n"
        "const items = await Promise.all(found.map((h) => tools.history_read_item({item_id: h.item_id, "
        "window_id: h.window_id})));\n"
        "print(found.length, 'hits');\n"
        "for (const it of items) print(it.output.split('\\n').slice(-1)[0]);")
FACTS = [{"role": "user", "content": f"alpha fact {i}: " + "detail " * 60} for i in range(3)]


async def _search_hits(tools_url: str, token: str, task: str) -> list[dict[str, Any]]:
    """The items the direct path's scripted model reads (it cannot parse results; a cell can)."""
    import aiohttp

    async with aiohttp.ClientSession() as http, http.post(
            f"{tools_url}/v1/tools/history_search_contents", json=SEARCH,
            headers={"Authorization": f"Bearer {token}", "x-ctp-task": task, "x-ctp-agent": "/root"}) as r:
        text = (await r.json())["text"]
    return [json.loads(line) for line in text.split("\n") if line.startswith("{")]


async def scenario() -> dict[str, Any]:
    """The issue's task — search history, read three items, write a note — with direct tools against one
    cell, both continuing the same conversation: upstream rounds and request bytes."""
    from bench.common import Processes
    from tests.emulator import Emulator, FunctionCall, Response, Text

    out: dict[str, Any] = {}
    async with Emulator() as emu:
        with Processes() as procs:
            svc = await asyncio.to_thread(procs.ctproxy, emu.url,
                                          ["--bridge", "code_mode,history,notes", "--enable", "code_mode"])
            state = StateDir.open(procs.workdir / f"state-{svc.port}")
            tools_url = re.search(r"tool server\s+(http://\S+)", svc.log()).group(1)  # type: ignore[union-attr]
            task = new_task(state)
            import openai

            client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{svc.port}/v1", api_key="sk-bench",
                                        max_retries=0, default_headers={"x-ctp-task": task, "x-ctp-agent": "/root"})
            # setup: the conversation so far holds three facts the task will look up in the history
            emu.script(Text("noted"))
            await client.responses.create(model="gpt-4.1", input=FACTS)
            hits: list[dict[str, Any]] = []
            for _ in range(100):  # the journal writes off the request path: wait until the items are found
                hits = await _search_hits(tools_url, state.token(), task)
                if len(hits) >= 3:
                    break
                await asyncio.sleep(0.1)
            reads = [{"item_id": h["item_id"], "window_id": h["window_id"]} for h in hits]
            plans = {
                "direct": [FunctionCall("history_search_contents", SEARCH),
                           Response([FunctionCall("history_read_item", r) for r in reads]),
                           FunctionCall("notes_write_file", WRITE), Text("summary written")],
                "code_mode": [FunctionCall("exec", {"code": CELL}),
                              FunctionCall("notes_write_file", WRITE), Text("summary written")],
            }
            ask = [*FACTS, {"role": "assistant", "content": "noted"},
                   {"role": "user", "content": "summarize what I told you in a note"}]
            for name, plan in plans.items():
                emu.reset()
                emu.script(*plan)
                final = await client.responses.create(model="gpt-4.1", input=ask)
                if final.output_text != "summary written":
                    raise RuntimeError(f"{name}: the scripted task did not finish: {final.output_text!r}")
                reqs = emu.responses_requests
                outputs = [str(i.get("output", "")) for r in reqs for i in r.json["input"]
                           if i.get("type") == "function_call_output"]
                if name == "direct" and not any("alpha fact 2" in o for o in outputs):
                    raise RuntimeError(f"the direct reads found nothing: {str(outputs)[:500]}")
                if name == "code_mode" and not any(o.startswith("Script completed") and "3 hits" in o
                                                   for o in outputs):
                    raise RuntimeError(f"the cell did not complete: {str(outputs)[:500]}")
                out[name] = {"upstream_rounds": len(reqs), "request_bytes": sum(len(r.raw_body) for r in reqs)}
    out["ratio_request_bytes"] = round(ratio(out["code_mode"]["request_bytes"], out["direct"]["request_bytes"]), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--quick", action="store_true", help="10 rounds")
    parser.add_argument("--engines-only", action="store_true", help="only part 7 (in-process against worker)")
    args = parser.parse_args()
    if args.engines_only:
        eng = asyncio.run(engines(max(5, args.rounds // 4)))
        _print_engines(eng)
        print(f"written to {write_result('codemode-engines', eng)}")
        return
    result = asyncio.run(run(10 if args.quick else args.rounds))
    lat = result["latency_ms"]
    print_table(["path", "n", "median ms", "p99 ms"],
                [[k, v["n"], v["median"], v["p99"]] for k, v in lat.items()])
    print()
    print_table(["ratio", "value"], [[k, v] for k, v in result["ratios"].items()])
    print()
    mem, defs = result["memory"], result["tool_definitions"]
    print(f"isolate: V8 heap used {mem['heap_used_bytes']} B, RSS per live isolate {mem['rss_per_isolate_bytes']} B")
    print(f"tool definitions: all {defs['tools_all']} tools {defs['bytes_all']} B; discovery on "
          f"{defs['tools_discovery']} tools {defs['bytes_discovery']} B; code mode (exec + wait) "
          f"{defs['bytes_code_mode']} B")
    sc = result["scenario"]
    print(f"scripted task: direct {sc['direct']['upstream_rounds']} rounds {sc['direct']['request_bytes']} B; "
          f"code mode {sc['code_mode']['upstream_rounds']} rounds {sc['code_mode']['request_bytes']} B "
          f"(ratio {sc['ratio_request_bytes']})")
    _print_engines(result["engines"])
    print(f"written to {write_result('codemode', result)}")


def _print_engines(eng: dict[str, Any]) -> None:
    print()
    print_table(["trivial cell (return 1)", "n", "median ms", "p99 ms"],
                [[k, v["n"], v["median"], v["p99"]] for k, v in eng["latency_ms"].items()])
    print()
    print_table(["ratio", "value"], [[k, v] for k, v in eng["ratios"].items()])


if __name__ == "__main__":
    main()
