"""Benchmark: the Responses WebSocket through ctproxy (issue 28), ratios measured in one run.

    .venv/bin/python bench/bench_ws.py [--rounds 40] [--conversations 50] [--loop-calls 20] [--loops 5] [--lanes 8]
                                       [--soak S] [--quick]

Processes: the emulator (WebSocket mode and HTTP; `--tool-loop N`: it answers a `lookup` call until the input
carries the N-th call's output), `ctproxy up` (default features: every create runs through the chain) and bare
`mitmdump` (reverse mode, no addons: it relays the socket's frames untouched).
a) One turn on an open connection: a WebSocket turn through ctproxy, the same turn over HTTP (SSE) through
   ctproxy, and the WebSocket turn through bare mitmdump; the emulator directly (WebSocket) as the floor.
   Medians of `--rounds` turns per target, round robin.
b) `--conversations` WebSocket conversations at once (each its own connection, 3 turns): wall time of the
   batch and the per-turn median, through ctproxy and through bare mitmdump.
c) A `--loop-calls`-call tool loop: over one WebSocket (each create chains the previous response by
   `previous_response_id` and sends only the call's output) against the same loop over HTTP (each request
   resends the whole input, as Codex does with `store: false`), directly and through ctproxy.
e) `--lanes K` creates sent at once on one connection: on K lanes (`stream_id`, run in parallel) against the same
   K creates on one lane (run one after another), through ctproxy and directly; each answer starts after 50 ms
   (the emulator's `--burst-latency`, a model's time to first event); wall time until the K-th
   `response.completed`, medians of `--loops` rounds.
d) `--soak S` (0: skipped): `--conversations` conversations keep turning for S seconds (each connection
   chains its creates by `previous_response_id`); ctproxy's resident memory every 10 s.
Printed: a table per part and the ratios; `bench/results/ws.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Processes, free_port, print_table, ratio, round_robin, summarize, write_result

HEADERS = {"Authorization": "Bearer sk-bench-ws", "Content-Type": "application/json"}
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


async def ws_turn(ws: aiohttp.ClientWebSocketResponse, body: dict[str, Any]) -> dict[str, Any]:
    await ws.send_str(orjson.dumps({"type": "response.create", **body}).decode())
    while True:
        msg = await ws.receive(timeout=60)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise RuntimeError(f"the socket ended: {msg}")
        if '"type":"response.' in msg.data[:40] and not any(t in msg.data[:40] for t in TERMINAL):
            continue
        event = orjson.loads(msg.data)
        if event["type"] in TERMINAL:
            if event["type"] != "response.completed":
                raise RuntimeError(f"turn failed: {msg.data[:300]}")
            return event["response"]


async def http_turn(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(base + "/v1/responses", data=orjson.dumps({**body, "stream": True}), headers=HEADERS) as r:
        buf = await r.read()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {buf[:300]!r}")
    for block in reversed(buf.split(b"\n\n")):
        for line in block.split(b"\n"):
            if line.startswith(b"data: ") and b'"response.completed"' in line[:60]:
                return orjson.loads(line[6:])["response"]
    raise RuntimeError("no response.completed")


def plain(i: int) -> dict[str, Any]:
    return {"model": "gpt-5", "store": False, "input": [user(f"turn {i}: hello")]}


async def single_turns(targets: dict[str, str], http: aiohttp.ClientSession, rounds: int) -> dict[str, Any]:
    sockets: dict[str, aiohttp.ClientWebSocketResponse] = {}
    for name, url in targets.items():
        if name.startswith("ws"):
            sockets[name] = await http.ws_connect(url + "/v1/responses", headers=HEADERS, max_msg_size=0)

    counter = iter(range(10**9))

    async def one(name: str, _url: str | int = 0) -> float:
        i = next(counter)
        t0 = time.perf_counter()
        if name in sockets:
            await ws_turn(sockets[name], plain(i))
        else:
            await http_turn(http, targets[name], plain(i))
        return time.perf_counter() - t0

    for name in targets:  # warm: connections, caches
        for i in range(3):
            await one(name, i)
    samples = await round_robin(targets, rounds, one)
    for ws in sockets.values():
        await ws.close()
    return {name: summarize(s) for name, s in samples.items()}


async def conversations(url: str, http: aiohttp.ClientSession, n: int, turns: int = 3) -> tuple[float, list[float]]:
    per_turn: list[float] = []

    async def conversation(c: int) -> None:
        async with http.ws_connect(url + "/v1/responses", headers=HEADERS) as ws:
            prev = None
            for t in range(turns):
                body: dict[str, Any] = {"model": "gpt-5", "store": False, "input": [user(f"c{c} t{t}")]}
                if prev:
                    body["previous_response_id"] = prev
                t0 = time.perf_counter()
                prev = (await ws_turn(ws, body))["id"]
                per_turn.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(conversation(c) for c in range(n)))
    return time.perf_counter() - t0, per_turn


TOOL = {"type": "function", "name": "lookup", "description": "look a key up",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}


def call_output(resp: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    call = next((o for o in resp["output"] if o.get("type") == "function_call"), None)
    if call is None:
        return None, None
    return call, {"type": "function_call_output", "call_id": call["call_id"], "output": f"value of {call['call_id']}"}


async def ws_loop(url: str, http: aiohttp.ClientSession, calls: int, i: int) -> float:
    async with http.ws_connect(url + "/v1/responses", headers=HEADERS) as ws:
        t0 = time.perf_counter()
        resp = await ws_turn(ws, {"model": "gpt-5", "store": False, "tools": [TOOL], "input": [user(f"loop {i}")]})
        n = 0
        while True:
            call, out = call_output(resp)
            if call is None:
                break
            n += 1
            resp = await ws_turn(ws, {"model": "gpt-5", "store": False, "tools": [TOOL], "input": [out],
                                      "previous_response_id": resp["id"]})
        took = time.perf_counter() - t0
    if n != calls:
        raise RuntimeError(f"the loop made {n} calls, not {calls}")
    return took


async def http_loop(url: str, http: aiohttp.ClientSession, calls: int, i: int) -> float:
    t0 = time.perf_counter()
    items: list[dict[str, Any]] = [user(f"loop {i}")]
    resp = await http_turn(http, url, {"model": "gpt-5", "store": False, "tools": [TOOL], "input": items})
    n = 0
    while True:
        call, out = call_output(resp)
        if call is None:
            break
        n += 1
        items += [{k: call[k] for k in ("type", "call_id", "name", "arguments")}, out]
        resp = await http_turn(http, url, {"model": "gpt-5", "store": False, "tools": [TOOL], "input": items})
    took = time.perf_counter() - t0
    if n != calls:
        raise RuntimeError(f"the loop made {n} calls, not {calls}")
    return took


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


async def lanes_burst(url: str, http: aiohttp.ClientSession, k: int, laned: bool, i: int) -> float:
    """K creates sent at once on one connection (each on its own lane, or all on the default lane): the time
    until the K-th completes."""
    async with http.ws_connect(url + "/v1/responses", headers=HEADERS) as ws:
        t0 = time.perf_counter()
        for j in range(k):
            body: dict[str, Any] = {"type": "response.create", "model": "gpt-5", "store": False,
                                    "input": [user(f"burst {i}.{j}")]}
            if laned:
                body["stream_id"] = f"lane_{j}"
            await ws.send_str(orjson.dumps(body).decode())
        done = 0
        while done < k:
            msg = await ws.receive(timeout=60)
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise RuntimeError(f"the socket ended: {msg}")
            if '"response.completed"' in msg.data[:40]:
                done += 1
            elif msg.data.startswith('{"type":"error"'):
                raise RuntimeError(f"a create failed: {msg.data[:300]}")
        return time.perf_counter() - t0


async def soak(url: str, pid: int, http: aiohttp.ClientSession, n: int, seconds: float) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    turns = 0
    samples: list[tuple[float, float]] = [(0.0, rss_mib(pid))]
    t0 = time.monotonic()

    async def conversation(c: int) -> None:
        nonlocal turns
        async with http.ws_connect(url + "/v1/responses", headers=HEADERS) as ws:
            prev = None
            while time.monotonic() < stop:
                body: dict[str, Any] = {"model": "gpt-5", "store": False, "input": [user(f"c{c} " + "w" * 2000)]}
                if prev:
                    body["previous_response_id"] = prev
                prev = (await ws_turn(ws, body))["id"]
                turns += 1

    async def sampler() -> None:
        while time.monotonic() < stop:
            await asyncio.sleep(10)
            samples.append((round(time.monotonic() - t0, 1), rss_mib(pid)))

    await asyncio.gather(sampler(), *(conversation(c) for c in range(n)))
    return {"turns": turns, "rss_mib": samples}


async def run(rounds: int, n_conv: int, loop_calls: int, loops: int, soak_s: float = 0, k: int = 8) -> dict[str, Any]:
    with Processes() as procs:
        port = free_port()
        emu = procs._spawn("emulator", port, [sys.executable, "-m", "tests.emulator", "--port", str(port),
                                              "--deltas", "8", "--max-recorded", "8",
                                              "--tool-loop", str(loop_calls), "--burst-latency", "0.05"],
                           lambda s: "listening on" in s.log())
        ct = procs.ctproxy(emu.url)
        bare = procs.mitmdump(emu.url)
        out: dict[str, Any] = {}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            # a) one turn
            targets = {"ws ctproxy": ct.url, "http ctproxy": ct.url, "ws bare mitmdump": bare.url,
                       "ws direct": emu.url, "http direct": emu.url}
            single = await single_turns(targets, http, rounds)
            print_table(["one turn", "median ms", "p99 ms"],
                        [[k, f"{v.median * 1000:.2f}", f"{v.p99 * 1000:.2f}"] for k, v in single.items()])
            med = {k: v.median for k, v in single.items()}
            out["single"] = {k: v.ms() for k, v in single.items()}
            out["single_ratios"] = {
                "ws ctproxy / http ctproxy": ratio(med["ws ctproxy"], med["http ctproxy"]),
                "ws ctproxy / ws bare mitmdump": ratio(med["ws ctproxy"], med["ws bare mitmdump"]),
                "ws ctproxy - ws bare mitmdump (ms)": round((med["ws ctproxy"] - med["ws bare mitmdump"]) * 1000, 2),
            }
            # b) concurrent conversations
            conc: dict[str, Any] = {}
            for name, url in (("ctproxy", ct.url), ("bare mitmdump", bare.url)):
                wall, per_turn = await conversations(url, http, n_conv)
                conc[name] = {"wall_s": round(wall, 3), "turn_median_ms": round(statistics.median(per_turn) * 1000, 2),
                              "turns": len(per_turn)}
            print_table([f"{n_conv} conversations × 3 turns", "wall s", "turn median ms"],
                        [[k, v["wall_s"], v["turn_median_ms"]] for k, v in conc.items()])
            out["conversations"] = conc
            out["conversations_ratio"] = ratio(conc["ctproxy"]["wall_s"], conc["bare mitmdump"]["wall_s"])
            # c) the tool loop
            loop_targets = {"ws direct": emu.url, "http direct": emu.url, "ws ctproxy": ct.url,
                            "http ctproxy": ct.url}

            counter = iter(range(10**9))

            async def loop(name: str, url: str) -> float:
                fn = ws_loop if name.startswith("ws") else http_loop
                return await fn(url, http, loop_calls, next(counter))

            loop_samples = await round_robin(loop_targets, loops, loop)
            ls = {k: summarize(v) for k, v in loop_samples.items()}
            print_table([f"{loop_calls}-call tool loop", "median ms"], [[k, f"{v.median * 1000:.1f}"]
                                                                       for k, v in ls.items()])
            out["tool_loop"] = {k: v.ms() for k, v in ls.items()}
            lm = {k: v.median for k, v in ls.items()}
            out["tool_loop_ratios"] = {
                "ws/http direct": ratio(lm["ws direct"], lm["http direct"]),
                "ws/http through ctproxy": ratio(lm["ws ctproxy"], lm["http ctproxy"]),
            }
            # e) lanes
            lane_targets = {f"{k} lanes ctproxy": ct.url, "1 lane ctproxy": ct.url, f"{k} lanes direct": emu.url,
                            "1 lane direct": emu.url}

            async def burst(name: str, url: str) -> float:
                return await lanes_burst(url, http, k, "lanes" in name, next(counter))

            lane_samples = await round_robin(lane_targets, loops, burst)
            lsum = {n: summarize(v) for n, v in lane_samples.items()}
            print_table([f"{k} creates at once on one socket", "median ms"],
                        [[n, f"{v.median * 1000:.1f}"] for n, v in lsum.items()])
            out["lanes"] = {n: v.ms() for n, v in lsum.items()}
            lmed = {n: v.median for n, v in lsum.items()}
            out["lanes_ratios"] = {
                "k lanes / 1 lane through ctproxy": ratio(lmed[f"{k} lanes ctproxy"], lmed["1 lane ctproxy"]),
                "k lanes / 1 lane direct": ratio(lmed[f"{k} lanes direct"], lmed["1 lane direct"]),
            }
            if soak_s:
                out["soak"] = await soak(ct.url, ct.proc.pid, http, n_conv, soak_s)
                print_table(["soak: s", "ctproxy RSS MiB"], out["soak"]["rss_mib"])
                print(f"soak: {out['soak']['turns']} turns in {soak_s:.0f} s over {n_conv} connections")
        print(json.dumps({k: v for k, v in out.items() if "ratio" in k}, indent=2))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--conversations", type=int, default=50)
    parser.add_argument("--loop-calls", type=int, default=20)
    parser.add_argument("--loops", type=int, default=5)
    parser.add_argument("--lanes", type=int, default=8, help="creates sent at once on one socket (part e)")
    parser.add_argument("--soak", type=float, default=0, metavar="S", help="a memory soak of S seconds (0: none)")
    parser.add_argument("--quick", action="store_true", help="a few rounds only (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.conversations, args.loops = 8, 10, 2
    result = asyncio.run(run(args.rounds, args.conversations, args.loop_calls, args.loops, args.soak, args.lanes))
    path = write_result("ws", {"args": vars(args), **result})
    print(f"written: {path}")


if __name__ == "__main__":
    main()
