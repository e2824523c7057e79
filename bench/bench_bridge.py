"""Benchmark: the tool bridge (issue 12), bridged against not bridged, through ctproxy, in one run.

    .venv/bin/python bench/bench_bridge.py [--rounds 30] [--ttfb-rounds 300] [--big-kb 256] [--quick]

Processes: the emulator (scripted: each turn is a `get_context_remaining` function call, then a text
answer; afterwards its echo answer), `ctproxy up --bridge context` and `ctproxy up` without the bridge.
a) A bridged turn: one streamed request through the bridged proxy; ctproxy runs the call and sends the
   second round itself. The same turn without the bridge: the client sends both rounds through the
   plain proxy (the second with the call's output). Added time = median(bridged) − median(round 1 + round
   2 without the bridge): what the bridge costs beyond the second upstream round trip (the tool call on
   the tool server included). Target ≤ 3 ms.
b) A request that needs no bridged call (the echo answer): time to first byte through the bridged proxy
   against the plain one, `--ttfb-rounds` pairs measured back to back (the order alternating), with a small
   body and with a `--big-kb` one (the bridge hands the body to its endpoint in memory). Target: within
   0.5 ms. Printed: the difference of the medians and the median of the paired differences (robust to the
   load of a shared machine drifting during the run).
Printed: medians, p99 and the differences measured in this run; `bench/results/bridge.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Processes, free_port, print_table, round_robin, summarize, write_result

HEADERS = {"Authorization": "Bearer sk-bench", "Content-Type": "application/json"}


def script(turns: int) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"type": "function_call", "name": "get_context_remaining", "call_id": f"call_b{i}",
                    "arguments": {}})
        out.append({"type": "text", "text": "the context is fine", "deltas": 8})
    return out


async def read_sse(http: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, float, list[dict]]:
    """(time to first byte, total time, the output items of the terminal event)."""
    t0 = time.perf_counter()
    async with http.post(url + "/v1/responses", data=json.dumps(body), headers=HEADERS) as resp:
        first = None
        buf = b""
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - t0
            buf += chunk
        total = time.perf_counter() - t0
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {buf[:300]!r}")
    output: list[dict] = []
    for block in buf.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: ") and b'"response.completed"' in line:
                output = json.loads(line[6:])["response"]["output"]
    return first or total, total, output


async def bridged_turn(http, on_url: str, i: int) -> float:
    _, total, output = await read_sse(http, on_url, {"model": "gpt-4.1", "input": f"turn {i}", "stream": True})
    if [o["type"] for o in output] != ["mcp_call", "message"]:
        raise RuntimeError(f"not a bridged turn: {[o['type'] for o in output]}")
    return total


async def plain_turn(http, off_url: str, i: int) -> float:
    user = {"role": "user", "content": f"turn {i}"}
    _, t1, output = await read_sse(http, off_url, {"model": "gpt-4.1", "input": [user], "stream": True})
    call = next(o for o in output if o["type"] == "function_call")
    follow = [user, {k: call[k] for k in ("type", "call_id", "name", "arguments")},
              {"type": "function_call_output", "call_id": call["call_id"], "output": "the context is fine"}]
    _, t2, _ = await read_sse(http, off_url, {"model": "gpt-4.1", "input": follow, "stream": True})
    return t1 + t2


def paired_median(a: list[float], b: list[float]) -> float:
    return statistics.median(x - y for x, y in zip(a, b, strict=True))


async def run(rounds: int, ttfb_rounds: int, big_kb: int) -> dict:
    with Processes() as procs:
        path = procs.workdir / "script.json"
        path.write_text(json.dumps(script(2 * rounds + 2)))  # every turn takes two replies
        port = free_port()
        emu = procs._spawn("emulator", port, [sys.executable, "-m", "tests.emulator", "--port", str(port),
                                              "--script", str(path), "--max-recorded", "4", "--deltas", "8"],
                           lambda s: "listening on" in s.log())
        on = procs.ctproxy(emu.url, ["--bridge", "context"])
        off = procs.ctproxy(emu.url)
        async with aiohttp.ClientSession() as http:
            # warm-up: one turn each (connections, first tool-server call, journal)
            await bridged_turn(http, on.url, -1)
            await plain_turn(http, off.url, -1)
            turns = await round_robin({"bridged": on.url, "plain": off.url}, rounds,
                                      lambda k, url: (bridged_turn if k == "bridged" else plain_turn)(
                                          http, url, 0))
            # the script is used up: from here the emulator answers with its echo (no call)
            for _ in range(4):
                await read_sse(http, on.url, {"model": "gpt-4.1", "input": "warm", "stream": True})
                await read_sse(http, off.url, {"model": "gpt-4.1", "input": "warm", "stream": True})

            big = "b" * (big_kb * 1024)

            def ttfb(text: str):
                async def one(_key: str, url: str) -> float:
                    first, _, _ = await read_sse(http, url, {"model": "gpt-4.1", "input": text, "stream": True})
                    return first
                return one

            targets = {"bridge on": on.url, "bridge off": off.url}
            firsts = await round_robin(targets, ttfb_rounds, ttfb("no call"))
            big_firsts = await round_robin(targets, max(ttfb_rounds // 4, 10), ttfb(big)) if big_kb else None
    b, p = summarize(turns["bridged"]), summarize(turns["plain"])
    t_on, t_off = summarize(firsts["bridge on"]), summarize(firsts["bridge off"])
    rows = [["bridged turn (1 request)", f"{b.median * 1000:.2f}", f"{b.p99 * 1000:.2f}"],
            ["same turn, 2 requests, no bridge", f"{p.median * 1000:.2f}", f"{p.p99 * 1000:.2f}"],
            ["TTFB, no bridged call, bridge on", f"{t_on.median * 1000:.2f}", f"{t_on.p99 * 1000:.2f}"],
            ["TTFB, bridge off", f"{t_off.median * 1000:.2f}", f"{t_off.p99 * 1000:.2f}"]]
    big_on = big_off = None
    if big_firsts is not None:
        big_on, big_off = summarize(big_firsts["bridge on"]), summarize(big_firsts["bridge off"])
        rows += [[f"TTFB, {big_kb} KB body, bridge on", f"{big_on.median * 1000:.2f}", f"{big_on.p99 * 1000:.2f}"],
                 [f"TTFB, {big_kb} KB body, bridge off", f"{big_off.median * 1000:.2f}", f"{big_off.p99 * 1000:.2f}"]]
    print_table(["path", "median ms", "p99 ms"], rows)
    added = (b.median - p.median) * 1000
    ttfb_diff = (t_on.median - t_off.median) * 1000
    ttfb_paired = paired_median(firsts["bridge on"], firsts["bridge off"]) * 1000
    print(f"\nadded by the bridge beyond the second round trip: {added:+.2f} ms median (target ≤ 3 ms)")
    print(f"TTFB of a request with no bridged call, bridge on − off: {ttfb_diff:+.2f} ms (medians), "
          f"{ttfb_paired:+.2f} ms (median of {ttfb_rounds} paired differences) (target ≤ 0.5 ms)")
    data = {"rounds": rounds, "ttfb_rounds": ttfb_rounds, "bridged": b.ms(), "plain": p.ms(), "ttfb_on": t_on.ms(),
            "ttfb_off": t_off.ms(), "added_ms": round(added, 3), "ttfb_diff_ms": round(ttfb_diff, 3),
            "ttfb_paired_ms": round(ttfb_paired, 3)}
    if big_on is not None and big_off is not None and big_firsts is not None:
        big_paired = paired_median(big_firsts["bridge on"], big_firsts["bridge off"]) * 1000
        print(f"the same with a {big_kb} KB body: {(big_on.median - big_off.median) * 1000:+.2f} ms (medians), "
              f"{big_paired:+.2f} ms (paired)")
        data.update({"big_kb": big_kb, "ttfb_big_on": big_on.ms(), "ttfb_big_off": big_off.ms(),
                     "ttfb_big_paired_ms": round(big_paired, 3)})
    print(f"written {write_result('bridge', data)}")
    return data


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30, help="bridged turns against two-request turns")
    ap.add_argument("--ttfb-rounds", type=int, default=300, help="TTFB pairs, bridge on and off")
    ap.add_argument("--big-kb", type=int, default=256, help="the big body's input size (0: not measured)")
    ap.add_argument("--quick", action="store_true", help="8 rounds, 40 TTFB pairs")
    args = ap.parse_args()
    if args.quick:
        asyncio.run(run(8, 40, min(args.big_kb, 64)))
    else:
        asyncio.run(run(args.rounds, args.ttfb_rounds, args.big_kb))


if __name__ == "__main__":
    main()
