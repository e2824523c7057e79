"""Proxy overhead: direct to the emulator vs bare mitmdump vs `ctproxy up`, measured in one run.

    .venv/bin/python bench/bench_proxy.py [--quick] [--only a,b,c,d,e,h] [--profile DIR] [--variant L=ARGS] [--pair A-B]
                                          [--workers N] [--store-pg]

Targets, each in its own process next to the emulator (tests/emulator, 200-event SSE answers):
  direct       the emulator itself
  bare         `mitmdump -q --mode reverse:http://127.0.0.1:EMU@PORT` (no addons): the baseline
  bare-stream  the same with `--set stream_large_bodies=1`: mitmdump passing bodies through chunk by chunk,
               as ctproxy does for SSE (bare buffers the whole answer, so its TTFB equals its last byte);
               informative, `--no-stream-baseline` drops it
  ctproxy      `ctproxy up --upstream http://127.0.0.1:EMU --trust-upstream` (default features, tool server on)
  pass-through the same with `--disable all`: ctproxy passing requests through untouched (the acceptance
               target of a and b: with every feature on, the body must at least be parsed, and on a 1.5 MB
               request one parse alone costs more than 10% of bare mitmdump's latency)
Scenarios (targets interleaved: every round each target once, in a new seeded order; after warm-up rounds):
  a  10 KB non-streaming Responses request: latency
  b  1.5 MB input (~2,000 items) non-streaming: latency
  c  SSE with a ~200-event stream: time to first body byte and to the last byte
  d  50 concurrent streams: wall time per batch, errors, streams/s and events/s; and where the CPU went while
     each target ran (emulator, this client, the proxy and each of its workers, the machine busy in all)
  e  CPU per request: the a request sent one at a time to each proxy, the proxy process's CPU time (all its
     threads, from /proc) divided by the requests; less noisy than latency on a shared machine
  h  attribution: each hook of the addon chain run in-process on the a and b bodies (no network),
     against one orjson.loads of the same body
Printed: median and p99 per target, the ratios ctproxy/bare, pass-through/bare and ctproxy/direct, and the
acceptance targets (median pass-through/bare ≤ 1.10 for a and b; added SSE TTFB over direct ≤ 5 ms median,
for both ctproxy columns). Against every other ctproxy column (the pass-through, each variant): ctproxy − it,
paired round by round (block by block for e), its median and a distribution-free 95 % interval, and the verdict
"slower" or "faster" only when the interval excludes zero, else "level": medians of separate columns move by
±0.2 ms between runs here, a difference paired by round far less. Two processes of one checkout still differ by up
to ≈0.15 ms on a, so a before/after runs a few of each as variants and compares the groups: `--pair 'h*-o*'`.
`--store-pg` starts a private PostgreSQL server (tests/support/postgres.py; Debian's `postgresql`), adds the column
store-pg (`ctproxy up --store postgresql://…`: notes, rollovers and usage in PostgreSQL) with its a and b ratios
against ctproxy (the embedded store), and measures notes append latency on both stores (the store interface's
`append`, in this process: 20 notes, 400 appends of ~100 bytes, interleaved).
Written: bench/results/proxy.json. `--profile DIR` runs ctproxy under cProfile (DIR/ctproxy-<port>.prof);
`--variant LABEL='--disable web_search'` adds more ctproxy columns, to attribute cost to features; an ARGS
that starts with `@DIR` runs the checkout in DIR (e.g. a `git worktree` of an earlier commit): before/after
in one run, `--variant before='@/tmp/before'`. With `--store-pg`, `{store-pg}` in a variant's ARGS is a fresh
database of the private server: `--variant 'pg-before=@/tmp/before --store {store-pg}' --pair store-pg-pg-before`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import shlex
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import (
    PROFILE_ENV,
    ROUND_SEED,
    Processes,
    Stats,
    paired_difference,
    print_table,
    ratio,
    round_robin,
    summarize,
    write_result,
)

HEADERS = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-real-key"}
CONCURRENCY = 50
EVENTS = 200
STREAM_DELTAS = EVENTS - 8  # + created, in_progress, item/part added, text/part/item done, completed
TTFB_BUDGET_MS = 5.0
RATIO_BUDGET = 1.10
PASS = "pass-through"
STORE_PG = "store-pg"  # --store-pg: ctproxy up --store postgresql://… (a private server)
CPU_ROUNDS = 10  # scenario e: per target, this many blocks of requests, alternating targets (paired by block)


@dataclass(frozen=True)
class Plan:
    rounds_a: int
    rounds_b: int
    rounds_c: int
    rounds_d: int
    rounds_e: int
    rounds_h: int
    warmup: int


FULL = Plan(rounds_a=600, rounds_b=100, rounds_c=300, rounds_d=10, rounds_e=2000, rounds_h=40, warmup=5)
QUICK = Plan(rounds_a=60, rounds_b=8, rounds_c=30, rounds_d=2, rounds_e=200, rounds_h=8, warmup=2)


# ---- payloads (pure) ----------------------------------------------------------------------------


def _history_item(i: int, filler: str) -> dict[str, Any]:
    """One of the item kinds an agent's history holds, in rotation."""
    kind = i % 4
    if kind == 0:
        return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": f"[{i}] {filler}"}]}
    if kind == 1:
        return {"type": "function_call", "call_id": f"call_{i}", "name": "exec_command",
                "arguments": orjson.dumps({"cmd": f"grep -n item{i} src/*.py", "workdir": "/w"}).decode()}
    if kind == 2:
        return {"type": "function_call_output", "call_id": f"call_{i - 1}", "output": f"src/a.py:{i}: {filler}"}
    return {"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": f"[{i}] {filler}", "annotations": []}]}


def make_payload(target_bytes: int, *, stream: bool, item_bytes: int = 700) -> dict[str, Any]:
    """A Responses request of about `target_bytes` serialized, made of ~`item_bytes` history items."""
    filler = ("The quick brown fox jumps over the lazy dog. " * (item_bytes // 45 + 1))[: max(1, item_bytes - 120)]
    payload: dict[str, Any] = {
        "model": "gpt-5", "stream": stream, "store": False, "instructions": "You are a benchmark.",
        "tools": [{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": True,
                   "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                  "required": ["cmd"], "additionalProperties": False}}],
        "input": [],
    }
    size = len(orjson.dumps(payload))
    i = 0
    while size < target_bytes:
        item = _history_item(i, filler)
        payload["input"].append(item)
        size += len(orjson.dumps(item)) + 1
        i += 1
    payload["input"].append({"type": "message", "role": "user", "content": "And now the question?"})
    return payload


# ---- one request --------------------------------------------------------------------------------


class RequestFailed(Exception):
    pass


async def post_json(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    start = time.perf_counter()
    async with http.post(url, data=body, headers=HEADERS) as resp:
        data = await resp.read()
    elapsed = time.perf_counter() - start
    if resp.status != 200 or not data.startswith(b"{"):
        raise RequestFailed(f"HTTP {resp.status}")
    return elapsed


async def post_stream(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float, int]:
    """(time to the first body byte, time to the last byte, SSE events received)."""
    start = time.perf_counter()
    first = None
    chunks: list[bytes] = []
    async with http.post(url, data=body, headers=HEADERS) as resp:
        async for chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - start
            chunks.append(chunk)
    last = time.perf_counter() - start
    data = b"".join(chunks)
    if resp.status != 200 or first is None or b"response.completed" not in data:
        raise RequestFailed(f"HTTP {resp.status}, {len(data)} bytes")
    return first, last, data.count(b"\n\n")


# ---- scenarios ----------------------------------------------------------------------------------


async def scenario_latency(http: aiohttp.ClientSession, urls: dict[str, str], body: bytes, rounds: int,
                           warmup: int) -> dict[str, list[float]]:
    """Seconds per request, per target, in round order."""
    await round_robin(urls, warmup, lambda _k, u: post_json(http, u, body))
    return await round_robin(urls, rounds, lambda _k, u: post_json(http, u, body))


async def scenario_sse(http: aiohttp.ClientSession, urls: dict[str, str], body: bytes, rounds: int,
                       warmup: int) -> tuple[dict[str, list[float]], dict[str, list[float]], int]:
    """Time to first and to last byte (seconds, per target, in round order) and the fewest events seen."""
    await round_robin(urls, warmup, lambda _k, u: post_stream(http, u, body))
    got = await round_robin(urls, rounds, lambda _k, u: post_stream(http, u, body))
    ttfb = {k: [s[0] for s in v] for k, v in got.items()}
    ttlb = {k: [s[1] for s in v] for k, v in got.items()}
    events = min(s[2] for v in got.values() for s in v)
    return ttfb, ttlb, events


async def _batch(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, int, int]:
    """50 streams at once: (wall seconds, errors, events received)."""
    start = time.perf_counter()
    results = await asyncio.gather(*(post_stream(http, url, body) for _ in range(CONCURRENCY)),
                                   return_exceptions=True)
    wall = time.perf_counter() - start
    errors = sum(1 for r in results if isinstance(r, BaseException))
    events = sum(r[2] for r in results if not isinstance(r, BaseException))
    return wall, errors, events


def _children(pid: int) -> list[int]:
    """Every descendant of `pid` (the workers of a `--workers N` supervisor), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (every core, every process), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait


class CpuLedger:
    """Where d's CPU goes, per target: the CPU seconds of the emulator, of this client process, of the proxy process
    and of each of its children (the workers of `--workers N`) while that target's batches ran, and the whole
    machine's busy CPU seconds over the same time (load from other work included)."""

    def __init__(self, emu_pid: int | None, pids: dict[str, int]):
        self.emu_pid, self.pids = emu_pid, pids
        self.spent: dict[str, dict[str, float]] = {}

    def _read(self, key: str) -> dict[str, float]:
        now = {"client": sum(os.times()[:2]), "machine busy": _busy_seconds()}
        if self.emu_pid is not None:
            now["emulator"] = cpu_seconds(self.emu_pid)
        if (pid := self.pids.get(key)) is not None:
            now["proxy"] = cpu_seconds(pid)
            for n, child in enumerate(sorted(_children(pid))):
                try:
                    now[f"child {n} ({child})"] = cpu_seconds(child)
                except OSError:
                    pass
        return now

    async def measure(self, key: str, work: Awaitable[Any]) -> Any:
        before = self._read(key)
        result = await work
        after = self._read(key)
        acc = self.spent.setdefault(key, {})
        for name, value in after.items():
            if name in before:
                acc[name] = acc.get(name, 0.0) + value - before[name]
        return result


async def scenario_concurrent(http: aiohttp.ClientSession, urls: dict[str, str], body: bytes, rounds: int,
                              warmup: int, ledger: CpuLedger | None = None) -> dict[str, dict[str, Any]]:
    await round_robin(urls, max(1, warmup // 2), lambda _k, u: _batch(http, u, body))
    if ledger is None:
        got = await round_robin(urls, rounds, lambda _k, u: _batch(http, u, body))
    else:
        got = await round_robin(urls, rounds, lambda k, u: ledger.measure(k, _batch(http, u, body)))
    out: dict[str, dict[str, Any]] = {}
    for key, batches in got.items():
        walls = [b[0] for b in batches]
        total_wall = sum(walls)
        out[key] = {
            "batches": len(batches), "streams": CONCURRENCY * len(batches),
            "errors": sum(b[1] for b in batches),
            "wall": summarize(walls), "walls": walls,
            "streams_per_s": round((CONCURRENCY * len(batches) - sum(b[1] for b in batches)) / total_wall, 1),
            "events_per_s": round(sum(b[2] for b in batches) / total_wall, 1),
        }
        if ledger is not None and key in ledger.spent:
            streams = CONCURRENCY * len(batches)
            out[key]["cpu_s_per_100_streams"] = {n: round(v / streams * 100, 3) for n, v in ledger.spent[key].items()}
            out[key]["machine_busy_cores"] = round(ledger.spent[key]["machine busy"] / total_wall, 2)
    return out


def print_cpu_ledger(conc: dict[str, dict[str, Any]]) -> None:
    print("d  CPU seconds per 100 streams while each target's batches ran (machine busy: cores in use, any process):")
    for key, row in conc.items():
        if "cpu_s_per_100_streams" in row:
            parts = ", ".join(f"{n} {v:.2f}" for n, v in row["cpu_s_per_100_streams"].items() if n != "machine busy")
            print(f"   {key:<14} {parts}; machine busy {row['machine_busy_cores']:.2f} cores")


# ---- e: CPU per request -------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (every thread, live or ended), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def scenario_cpu(http: aiohttp.ClientSession, urls: dict[str, str], pids: dict[str, int], body: bytes,
                       rounds: int, warmup: int) -> dict[str, dict[str, Any]]:
    """CPU ms per request of each proxy process: blocks of sequential requests, targets alternating."""
    per_block = max(1, rounds // CPU_ROUNDS)
    blocks: dict[str, list[float]] = {name: [] for name in pids}
    for name in pids:
        for _ in range(warmup * 4):
            await post_json(http, urls[name], body)
    names = list(pids)
    order = random.Random(ROUND_SEED)
    for _ in range(CPU_ROUNDS):
        order.shuffle(names)  # a new order each round, as `round_robin`'s
        for name in names:
            pid = pids[name]
            before = cpu_seconds(pid)
            for _ in range(per_block):
                await post_json(http, urls[name], body)
            blocks[name].append((cpu_seconds(pid) - before) / per_block * 1000)
    base = summarize(blocks["bare"]).median
    return {name: {"cpu_ms_per_request": round(summarize(v).median, 3),
                   "ratio_to_bare": round(ratio(summarize(v).median, base), 3),
                   "blocks": [round(x, 3) for x in v]} for name, v in blocks.items()}


def print_cpu(cpu: dict[str, dict[str, Any]]) -> None:
    print("e  CPU per request (a body, sequential; median of blocks; proxy process, all threads)")
    for name, row in cpu.items():
        print(f"   {name:<14} {row['cpu_ms_per_request']:7.3f} ms  ×{row['ratio_to_bare']:.3f} of bare")


# ---- h: in-process attribution ------------------------------------------------------------------


def _chain_flow(body: bytes, port: int) -> Any:
    """A reverse-mode flow of `POST /v1/responses` to a trusted loopback upstream, as ctproxy sees it."""
    from mitmproxy import http
    from mitmproxy.proxy.mode_specs import ProxyMode
    from mitmproxy.test import tflow

    flow = tflow.tflow()
    flow.client_conn.proxy_mode = ProxyMode.parse(f"reverse:http://127.0.0.1:{port}")
    flow.request = http.Request.make("POST", f"http://127.0.0.1:{port}/v1/responses", body,
                                     {"content-type": "application/json", "authorization": HEADERS["authorization"]})
    return flow


def _json_answer() -> Any:
    from mitmproxy import http

    body = orjson.dumps({"id": "resp_bench", "object": "response", "status": "completed", "model": "gpt-5",
                         "output": [{"type": "message", "role": "assistant", "id": "msg_1",
                                     "content": [{"type": "output_text", "text": "hi", "annotations": []}]}],
                         "usage": {"input_tokens": 10, "output_tokens": 2, "total_tokens": 12}})
    return http.Response.make(200, body, {"content-type": "application/json"})


async def _call_hook(fn: Any, flow: Any) -> None:
    result = fn(flow)
    if asyncio.iscoroutine(result):
        await result


async def hook_costs(bodies: dict[str, bytes], rounds: int) -> dict[str, dict[str, float]]:
    """Wall time of every hook of `addons.chain()` per request, run in this process on real flows (no
    network), with one `orjson.loads` of the same body as the baseline measured alongside.
    Medians in ms; async hooks include their database round trips."""
    import tempfile

    from mitmproxy.test import taddons

    import addons

    out: dict[str, dict[str, float]] = {}
    chain = addons.chain()
    with tempfile.TemporaryDirectory(prefix="ctproxy-bench-hooks-") as state, \
            taddons.context(*chain, loadcore=False) as tctx:
        tctx.options.update(ctp_state_dir=state, ctp_upstream="http://127.0.0.1:9", ctp_trust_upstream=True)
        for label, body in bodies.items():
            samples: dict[str, list[float]] = {"orjson.loads (baseline)": []}
            for _ in range(rounds):
                start = time.perf_counter()
                parsed = orjson.loads(body)
                samples["orjson.loads (baseline)"].append(time.perf_counter() - start)
                del parsed  # freeing 1.5 MB of objects is not part of a parse
            for _ in range(rounds):
                await time_hooks(chain, _chain_flow(body, 9), samples)
            out[label] = {k: round(summarize(v).median * 1000, 4) for k, v in samples.items()}
        for addon in chain:
            if (done := getattr(addon, "done", None)) is not None:
                result = done()
                if asyncio.iscoroutine(result):
                    await result
    return out


def print_hook_costs(costs: dict[str, dict[str, float]]) -> None:
    print("h  in-process cost of each chain hook per request (median ms; ×: of one orjson.loads of that body)")
    for label, rows in costs.items():
        base = rows["orjson.loads (baseline)"]
        hooks = {k: v for k, v in rows.items() if k != "orjson.loads (baseline)"}
        print(f"   {label}: baseline orjson.loads {base:.3f} ms; all hooks {sum(hooks.values()):.3f} ms "
              f"(×{ratio(sum(hooks.values()), base):.2f})")
        for name, ms in sorted(hooks.items(), key=lambda kv: -kv[1]):
            if ms >= 0.01:
                print(f"     {name:<30} {ms:8.3f} ms  ×{ratio(ms, base):6.2f}")


# ---- report -------------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value * 1000:.2f}"


RATIO_COLUMNS = (("ctproxy", "bare"), (PASS, "bare"), ("ctproxy", "direct"))


def latency_rows(label: str, stats: dict[str, Stats]) -> list[list[str]]:
    """Median row and p99 row: one column per target, then ctproxy/bare, pass-through/bare, ctproxy/direct."""
    med = [label, *(_ms(s.median) for s in stats.values()),
           *(f"{ratio(stats[a].median, stats[b].median):.3f}" for a, b in RATIO_COLUMNS)]
    p99 = ["  p99", *(_ms(s.p99) for s in stats.values()),
           *(f"{ratio(stats[a].p99, stats[b].p99):.3f}" for a, b in RATIO_COLUMNS)]
    return [med, p99]


def ratios(stats: dict[str, Stats]) -> dict[str, float]:
    """ctproxy (and every variant) against bare mitmdump and direct, medians and p99s."""
    out: dict[str, float] = {}
    for name in [k for k in stats if k not in ("direct", "bare")]:
        bases = ("bare", "direct") if name == "bare-stream" or "bare-stream" not in stats else (
            "bare", "direct", "bare-stream")
        for base in bases:
            out[f"{name}/{base} median"] = round(ratio(stats[name].median, stats[base].median), 4)
            out[f"{name}/{base} p99"] = round(ratio(stats[name].p99, stats[base].p99), 4)
    return out


@dataclass
class Bodies:
    small: bytes
    big: bytes
    big_items: int
    sse: bytes


def make_bodies() -> Bodies:
    big = make_payload(1_500_000, stream=False, item_bytes=1000)  # ≈2,000 items
    return Bodies(small=orjson.dumps(make_payload(10_000, stream=False)), big=orjson.dumps(big),
                  big_items=len(big["input"]),
                  sse=orjson.dumps({"model": "gpt-5", "input": "stream 200 events", "stream": True, "store": False}))


def start_targets(procs: Processes, variants: dict[str, list[str]], stream_baseline: bool
                  ) -> tuple[dict[str, str], dict[str, int]]:
    """Start the emulator and every proxy; returns target name → `POST /v1/responses` URL (in column
    order) and proxy name → process id."""
    emu = procs.emulator(stream_deltas=STREAM_DELTAS)
    services = {"bare": procs.mitmdump(emu.url)}
    if stream_baseline:
        services["bare-stream"] = procs.mitmdump(emu.url, options={"stream_large_bodies": "1"})
    services["ctproxy"] = procs.ctproxy(emu.url)
    services[PASS] = procs.ctproxy(emu.url, extra_args=["--disable", "all"])
    for label, args in variants.items():
        tree = Path(args[0][1:]) if args and args[0].startswith("@") else None  # '@DIR …': that checkout's code
        services[label] = procs.ctproxy(emu.url, extra_args=args[1:] if tree else args, tree=tree)
    urls = {"direct": f"{emu.url}/v1/responses", **{k: f"{v.url}/v1/responses" for k, v in services.items()}}
    global _EMULATOR_PID
    _EMULATOR_PID = emu.proc.pid
    return urls, {k: v.proc.pid for k, v in services.items()}


_EMULATOR_PID: int | None = None  # the emulator `start_targets` started last (d's CPU ledger reads it)


async def network_scenarios(plan: Plan, only: set[str], urls: dict[str, str], pids: dict[str, int], bodies: Bodies,
                            result: dict[str, Any], pairs: Sequence[tuple[str, str]] = (),
                            emu_pid: int | None = None) -> list[list[str]]:
    """Scenarios a–e against every target; fills `result` and returns the table rows."""
    rows: list[list[str]] = []
    names = list(urls)
    paired: dict[str, dict[str, list[float]]] = {}  # scenario → target → samples in round order (seconds)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False) as http:
        for key, label, body, rounds in (
                ("a", f"a 10 KB ({len(bodies.small) / 1e3:.1f} KB)", bodies.small, plan.rounds_a),
                ("b", f"b {len(bodies.big) / 1e6:.2f} MB, {bodies.big_items} items", bodies.big, plan.rounds_b)):
            if key not in only:
                continue
            times = await scenario_latency(http, urls, body, rounds, plan.warmup)
            stats = {k: summarize(v) for k, v in times.items()}
            name = "a_10kb" if key == "a" else "b_1_5mb"
            paired[name] = times
            result["scenarios"][name] = {k: s.ms() for k, s in stats.items()}
            result["ratios"][name] = ratios(stats)
            if STORE_PG in stats:  # the PostgreSQL store against the embedded one, one run
                for q in ("median", "p99"):
                    result["ratios"][name][f"{STORE_PG}/ctproxy {q}"] = round(
                        ratio(getattr(stats[STORE_PG], q), getattr(stats["ctproxy"], q)), 4)
            result["acceptance"][f"{key}: median pass-through/bare <= 1.10"] = ratio(
                stats[PASS].median, stats["bare"].median) <= RATIO_BUDGET
            if key == "b":  # issue 11: what the defaults cost over bare, against one parse and one serialization
                floor = parse_and_serialize_ms(body)
                added = (stats["ctproxy"].median - stats["bare"].median) * 1000
                result["ratios"]["b_floor"] = {"ctproxy_minus_bare_ms": round(added, 3), **floor}
                result["acceptance"]["b: ctproxy - bare <= one orjson.loads + one orjson.dumps (medians)"] = (
                    added <= floor["loads_ms"] + floor["dumps_ms"])
            rows += latency_rows(label, stats)
        if "c" in only:
            ttfb_times, ttlb_times, events = await scenario_sse(http, urls, bodies.sse, plan.rounds_c, plan.warmup)
            paired["c_sse_ttfb"], paired["c_sse_ttlb"] = ttfb_times, ttlb_times
            ttfb = {k: summarize(v) for k, v in ttfb_times.items()}
            ttlb = {k: summarize(v) for k, v in ttlb_times.items()}
            added = (ttfb["ctproxy"].median - ttfb["direct"].median) * 1000
            added_pass = (ttfb[PASS].median - ttfb["direct"].median) * 1000
            result["scenarios"]["c_sse_ttfb"] = {k: s.ms() for k, s in ttfb.items()}
            result["scenarios"]["c_sse_ttlb"] = {k: s.ms() for k, s in ttlb.items()}
            result["scenarios"]["c_sse_events"] = events
            result["ratios"]["c_sse_ttfb"] = ratios(ttfb)
            result["ratios"]["c_sse_ttlb"] = ratios(ttlb)
            result["ratios"]["c_sse_added_ttfb_over_direct_ms"] = round(added, 3)
            result["ratios"]["c_sse_added_ttfb_over_direct_ms_pass_through"] = round(added_pass, 3)
            result["acceptance"]["c: added SSE TTFB over direct <= 5 ms (median), defaults"] = added <= TTFB_BUDGET_MS
            result["acceptance"]["c: added SSE TTFB over direct <= 5 ms (median), pass-through"] = (
                added_pass <= TTFB_BUDGET_MS)
            rows += latency_rows(f"c SSE TTFB ({events} events)", ttfb)
            rows += latency_rows("c SSE last byte", ttlb)
        if "d" in only:
            ledger = CpuLedger(emu_pid, pids) if Path("/proc/stat").exists() else None
            conc = await scenario_concurrent(http, urls, bodies.sse, plan.rounds_d, plan.warmup, ledger)
            if ledger is not None:
                print_cpu_ledger(conc)
            result["scenarios"]["d_concurrent"] = {k: {**{f: x for f, x in v.items() if f != "walls"},
                                                       "wall": v["wall"].ms()} for k, v in conc.items()}
            walls = {k: v["wall"] for k, v in conc.items()}
            paired["d_concurrent_wall"] = {k: v["walls"] for k, v in conc.items()}
            result["ratios"]["d_concurrent_wall"] = ratios(walls)
            rows += latency_rows(f"d {CONCURRENCY} streams, batch wall", walls)
            sps = {k: v["streams_per_s"] for k, v in conc.items()}
            rows.append(["  errors", *(str(conc[k]["errors"]) for k in names), *([""] * len(RATIO_COLUMNS))])
            rows.append(["  streams/s", *(str(sps[k]) for k in names),
                         *(f"{ratio(sps[a], sps[b]):.3f}" for a, b in RATIO_COLUMNS)])
            rows.append(["  events/s", *(str(conc[k]["events_per_s"]) for k in names), *([""] * len(RATIO_COLUMNS))])
            for label in names:
                if label.startswith(WORKERS_PREFIX):  # --workers N: its streams/s against one worker (ctproxy)
                    r = ratio(sps[label], sps["ctproxy"])
                    result["ratios"][f"d_streams_per_s_{label}_over_ctproxy"] = round(r, 3)
                    result["acceptance"][f"d: {label} streams/s >= {WORKERS_TARGET}x one worker"] = (
                        r >= WORKERS_TARGET)
        if "e" in only and Path("/proc/self/stat").exists():
            cpu = await scenario_cpu(http, urls, pids, bodies.small, plan.rounds_e, plan.warmup)
            result["scenarios"]["e_cpu_per_request"] = cpu
            paired["e_cpu_per_request"] = {k: [x / 1000 for x in v["blocks"]] for k, v in cpu.items()}
    result["paired"] = paired_rows(paired, pairs)
    return rows


def paired_rows(samples: dict[str, dict[str, list[float]]], pairs: Sequence[tuple[str, str]] = ()
                ) -> dict[str, dict[str, dict[str, Any]]]:
    """"A − B" → scenario → the difference round by round (`Paired`, in ms): ctproxy against every other ctproxy
    column (a variant, the pass-through), then each of `pairs`."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for scenario, times in samples.items():
        wanted = [("ctproxy", k) for k in times if k not in FIXED_COLUMNS or k == PASS]
        for a, b in [*wanted, *pairs]:
            sa, sb = _column(times, a), _column(times, b)
            if sa is None or sb is None:
                continue
            p = paired_difference(sa, sb)
            out.setdefault(f"{a} − {b}", {})[scenario] = {
                "n": p.n, "median_ms": round(p.median * 1000, 3), "low_ms": round(p.low * 1000, 3),
                "high_ms": round(p.high * 1000, 3), "verdict": p.verdict}
    return out


FIXED_COLUMNS = frozenset({"direct", "bare", "bare-stream", "ctproxy", PASS})  # every column but the variants


def _column(times: dict[str, list[float]], label: str) -> list[float] | None:
    """A column's samples, or for `PREFIX*` the round-by-round mean of every column whose label starts with
    PREFIX (several processes of one checkout: two identical processes differ by up to ≈0.15 ms on a 10 KB
    request, more than a paired interval of one pair shows, so a before/after needs a few of each)."""
    if not label.endswith("*"):
        return times.get(label)
    group = [v for k, v in times.items() if k.startswith(label[:-1]) and k not in FIXED_COLUMNS]  # variants only
    return [sum(r) / len(r) for r in zip(*group, strict=True)] if group else None


async def time_hooks(chain: Sequence[Any], flow: Any, samples: dict[str, list[float]],
                     before_answer: Callable[[Any], None] | None = None) -> None:
    """One exchange of `flow` through every hook of `chain` in process (the answer is `_json_answer()`),
    each hook's time appended to `samples["Stage.hook"]`; `before_answer` sees the flow as forwarded."""
    for phase in (("requestheaders", "request"), ("responseheaders", "response")):
        if phase[0] == "responseheaders":
            if before_answer is not None:
                before_answer(flow)
            flow.response = _json_answer()
        for hook in phase:
            for addon in chain:
                fn = getattr(addon, hook, None)
                if fn is None:
                    continue
                start = time.perf_counter()
                await _call_hook(fn, flow)
                samples.setdefault(f"{type(addon).__name__}.{hook}", []).append(time.perf_counter() - start)


def parse_and_serialize_ms(body: bytes, rounds: int = 30) -> dict[str, float]:
    """One `orjson.loads` and one `orjson.dumps` of `body`, medians of a tight loop in this process (the best
    case of each: the floor issue 11 sets for what ctproxy with its defaults may add over bare mitmdump)."""
    value = orjson.loads(body)
    loads, dumps = [], []
    for _ in range(rounds):
        t = time.perf_counter()
        orjson.loads(body)
        loads.append(time.perf_counter() - t)
        t = time.perf_counter()
        orjson.dumps(value)
        dumps.append(time.perf_counter() - t)
    return {"loads_ms": round(summarize(loads).median * 1000, 3), "dumps_ms": round(summarize(dumps).median * 1000, 3)}


WORKERS_PREFIX = "workers-"  # the column of `--workers N` (`ctproxy up --workers N`)
WORKERS_TARGET = 1.5  # issue 32: d's streams/s with 2 workers against 1 on a 2-core machine


def print_report(result: dict[str, Any], names: list[str], rows: list[list[str]],
                 variants: dict[str, list[str]]) -> None:
    meta = result["meta"]
    print(f"bench_proxy: {meta['plan']}; times in ms; targets interleaved round-robin after warm-up; "
          f"ratios are medians (p99 rows: p99s); load average before/after "
          f"{meta['loadavg_before'][0]}/{meta['loadavg_after'][0]} on {meta['cpus']} CPUs")
    if rows:
        labels = {"bare": "bare mitmdump", "bare-stream": "bare streaming"}
        print_table(["scenario", *(labels.get(n, n) for n in names), *(f"{a}/{b}" for a, b in RATIO_COLUMNS)],
                    rows)
    if "c_sse_added_ttfb_over_direct_ms" in result["ratios"]:
        added = result["ratios"]["c_sse_added_ttfb_over_direct_ms"]
        added_pass = result["ratios"]["c_sse_added_ttfb_over_direct_ms_pass_through"]
        print(f"added SSE TTFB over direct (median): ctproxy {added:.2f} ms, pass-through {added_pass:.2f} ms")
    if "b_floor" in result["ratios"]:
        f = result["ratios"]["b_floor"]
        print(f"b: ctproxy - bare {f['ctproxy_minus_bare_ms']:.2f} ms; one orjson.loads {f['loads_ms']:.2f} ms + "
              f"one orjson.dumps {f['dumps_ms']:.2f} ms = {f['loads_ms'] + f['dumps_ms']:.2f} ms")
    if "e_cpu_per_request" in result["scenarios"]:
        print_cpu(result["scenarios"]["e_cpu_per_request"])
    for key, r in result["ratios"].items():
        if key.startswith("d_streams_per_s_" + WORKERS_PREFIX):
            label = key.removeprefix("d_streams_per_s_").removesuffix("_over_ctproxy")
            d = result["scenarios"]["d_concurrent"]
            print(f"d {CONCURRENCY} streams: {label} {d[label]['streams_per_s']} streams/s against one worker "
                  f"{d['ctproxy']['streams_per_s']}: {r:.2f}x")
    for label in variants:
        line = ", ".join(f"{scen} {r[f'{label}/bare median']:.3f}" for scen, r in result["ratios"].items()
                         if isinstance(r, dict) and f"{label}/bare median" in r)
        print(f"variant {label} ({' '.join(variants[label])}) / bare, medians: {line}")
    for pair, scenarios in result.get("paired", {}).items():
        print(f"{pair}, paired round by round: median ms [95 % interval] verdict")
        for scen, p in scenarios.items():
            print(f"   {scen:<20} {p['median_ms']:+8.3f} [{p['low_ms']:+.3f}, {p['high_ms']:+.3f}]  {p['verdict']}"
                  f"  (n={p['n']})")
    if "hooks" in result:
        print_hook_costs(result["hooks"])
    for name, ok in result["acceptance"].items():
        print(f"acceptance  {'met   ' if ok else 'MISSED'}  {name}")


async def run(plan: Plan, only: set[str], variants: dict[str, list[str]], stream_baseline: bool = True,
              pairs: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    started = time.perf_counter()
    bodies = make_bodies()
    result: dict[str, Any] = {
        "meta": {"python": platform.python_version(), "cpus": os.cpu_count(), "plan": plan.__dict__,
                 "loadavg_before": [round(x, 2) for x in os.getloadavg()],
                 "payload_bytes": {"a": len(bodies.small), "b": len(bodies.big), "c": len(bodies.sse)},
                 "items_b": bodies.big_items, "profile": os.environ.get(PROFILE_ENV) or None,
                 "variants": variants},
        "scenarios": {}, "ratios": {}, "acceptance": {},
    }
    rows: list[list[str]] = []
    names: list[str] = []
    if only & {"a", "b", "c", "d", "e"}:
        with Processes() as procs:
            urls, pids = start_targets(procs, variants, stream_baseline)
            result["meta"]["startup_s"] = round(time.perf_counter() - started, 2)
            names = list(urls)
            rows = await network_scenarios(plan, only, urls, pids, bodies, result, pairs, _EMULATOR_PID)
    if "h" in only:
        result["hooks"] = await hook_costs({"a": bodies.small, "b": bodies.big}, plan.rounds_h)
    result["meta"]["total_s"] = round(time.perf_counter() - started, 1)
    result["meta"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print_report(result, names, rows, variants)
    return result


def notes_append_latency(pg_url: str, rounds: int = 400, notes: int = 20) -> dict[str, dict[str, float | int]]:
    """The store interface's notes `append` on the embedded store (a fresh state directory) and on PostgreSQL,
    interleaved append by append: median and p99 per store (ms)."""
    import tempfile

    from proxy.state import StateDir
    from proxy.store.embedded import EmbeddedStore
    from proxy.store.pg import PostgresStore

    line = "x" * 96 + "\n"
    times: dict[str, list[float]] = {"embedded": [], "postgresql": []}
    with tempfile.TemporaryDirectory(prefix="bench-notes-") as tmp:
        stores = {"embedded": EmbeddedStore(StateDir.open(Path(tmp) / "state")),
                  "postgresql": PostgresStore.open(pg_url)}
        try:
            backends = {k: st.notes("task_benchnotes0001") for k, st in stores.items()}
            for i in range(rounds + 20):
                order = list(backends.items())
                random.Random(ROUND_SEED + i).shuffle(order)
                for kind, nb in order:
                    t0 = time.perf_counter()
                    nb.append("/root", f"bench/n{i % notes}.md", line)
                    if i >= 20:  # warm-up appends not counted
                        times[kind].append(time.perf_counter() - t0)
        finally:
            for st in stores.values():
                st.close()
    return {k: summarize(v).ms() for k, v in times.items()}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (fewer rounds)")
    parser.add_argument("--only", default="a,b,c,d,e,h", help="comma-separated scenarios to run (default: all)")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help=f"run ctproxy under cProfile, writing DIR/ctproxy-<port>.prof (same as {PROFILE_ENV})")
    parser.add_argument("--no-stream-baseline", action="store_true",
                        help="do not measure mitmdump with stream_large_bodies=1 (the streaming baseline)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=ARGS",
                        help="also measure ctproxy with these extra `ctproxy up` arguments, e.g. "
                        "'no-ws=--disable web_search' (repeatable; for attributing cost)")
    parser.add_argument("--workers", type=int, default=None, metavar="N",
                        help="also measure `ctproxy up --workers N` (column workers-N) and print d's streams/s "
                        "against one worker (ctproxy); e counts only the supervisor's CPU for it")
    parser.add_argument("--store-pg", action="store_true",
                        help=f"start a private PostgreSQL server and also measure `ctproxy up --store URL` (column "
                        f"{STORE_PG}, ratios against ctproxy on the embedded store) and notes append latency on both")
    parser.add_argument("--pair", action="append", default=[], metavar="A-B",
                        help="also print A − B paired round by round, for two columns (repeatable), e.g. "
                        "--variant h1=@. --variant h2=@. --variant b1=@/tmp/before --variant b2=@/tmp/before "
                        "--pair 'h*-b*' (PREFIX* = the mean of those columns, round by round: identical "
                        "processes differ by ≈0.15 ms, so compare a few of each; docs/benchmarks.md)")
    return parser.parse_args(argv)


def parse_variants(specs: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for spec in specs:
        label, sep, args = spec.partition("=")
        if not sep or not label or label in FIXED_COLUMNS:
            raise SystemExit(f"--variant wants LABEL=ARGS with a new label, got {spec!r}")
        out[label] = shlex.split(args)
    return out


def split_pair(spec: str, labels: set[str]) -> tuple[str, str]:
    """`--pair A-B` into its two columns. Labels may hold hyphens themselves (`pass-through`, `store-pg`), so the
    split is at the one hyphen that leaves a column (or a `PREFIX*` group of variants) on each side."""
    def known(side: str) -> bool:
        if side.endswith("*"):
            return any(x.startswith(side[:-1]) and x not in FIXED_COLUMNS for x in labels)
        return side in labels

    splits = [(spec[:i], spec[i + 1:]) for i, ch in enumerate(spec) if ch == "-"]
    fits = [(a, b) for a, b in splits if known(a) and known(b)]
    if len(fits) != 1:
        ways = " or ".join(f"{a} | {b}" for a, b in fits)
        why = f"one way only (it splits {ways})" if fits else "two columns"
        raise SystemExit(f"--pair {spec!r}: wants A-B, {why}; the columns: {', '.join(sorted(labels))}")
    return fits[0]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.profile:
        os.environ[PROFILE_ENV] = str(args.profile.resolve())
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    variants = parse_variants(args.variant)
    if args.workers is not None:
        variants[f"{WORKERS_PREFIX}{args.workers}"] = ["--workers", str(args.workers)]
    labels = {*FIXED_COLUMNS, *variants, *([STORE_PG] if args.store_pg else [])}
    pairs = [split_pair(p, labels) for p in args.pair]
    server = None
    if args.store_pg:
        import tempfile

        from tests.support.postgres import PrivateServer, unavailable

        if (why := unavailable()) is not None:
            raise SystemExit(f"--store-pg: {why}")
        server = PrivateServer(Path(tempfile.mkdtemp(prefix="ctproxy-pg-"))).start()
        variants[STORE_PG] = ["--store", server.fresh_database("bench_proxy")]
        for n, (label, vargs) in enumerate(list(variants.items())):  # '{store-pg}' in a variant: a database of its own
            if "{store-pg}" in vargs:
                variants[label] = [server.fresh_database(f"bench_v{n}") if a == "{store-pg}" else a for a in vargs]
    try:
        result = asyncio.run(run(QUICK if args.quick else FULL, only, variants,
                                 stream_baseline=not args.no_stream_baseline, pairs=pairs))  # type: ignore[arg-type]
        if server is not None:
            result["notes_append_ms"] = appends = notes_append_latency(server.fresh_database("bench_notes"))
            print("notes append (store interface, ~100 B each), ms: " + "; ".join(
                f"{k} median {v['median']:.3f} p99 {v['p99']:.3f}" for k, v in appends.items()))
            for name in ("a_10kb", "b_1_5mb"):
                if (r := result["ratios"].get(name, {})).get(f"{STORE_PG}/ctproxy median") is not None:
                    print(f"{name}: {STORE_PG}/ctproxy median {r[f'{STORE_PG}/ctproxy median']:.3f}, "
                          f"p99 {r[f'{STORE_PG}/ctproxy p99']:.3f}")
    finally:
        if server is not None:
            server.stop()
    path = write_result("proxy", result)
    print(f"written: {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
