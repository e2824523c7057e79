"""Memory and fairness under load (issue 10): does the proxy give back what it takes?

    python bench/bench_soak.py [--quick] [--only rss big mem stall] [--seconds 60] [--clients 50]

  rss  `--clients` streaming clients for `--seconds` through `ctproxy up` with default features and with
       `--disable all` (the pass-through baseline, same run). Each client holds an ordinary multi-turn
       conversation (resends its history, starts a new one every few turns), as agents do. The proxy
       process's RSS is sampled every second (/proc/PID/status VmRSS); printed: RSS after the warm-up,
       at the end, after an idle pause, the growth after warm-up and its slope per minute, requests and
       errors. Goal: growth after warm-up ≤ +10 MB over 60 s at 50 clients.
  big  `--rounds` 100,000-item (≈5 MB) requests, each a new session, through ctproxy (defaults)
       while a tiny request is started every
       50 ms (open loop: a stalled proxy makes every tiny request sent meanwhile wait): the tiny
       request's latency during the big one (median, p99, max) against the same tiny
       request with the proxy idle, and the proxy's RSS before and after the big one. Goal: tiny median
       during the big one ≤ 100 ms.

  workers  issue 32 ("the soak flat per worker"): the rss soak (`--clients` streams for `--seconds` after
       `--warmup`) through `ctproxy up --workers 2` (`--workers N`); every `--sample-every` seconds the RSS of each
       worker (pids from the state directory's run.json, as `ctproxy status` shows them) and of the supervisor.
       Printed per process: RSS after the warm-up, at the middle, at the end and after the idle pause, its growth
       after warm-up and slope per minute, and the requests, errors and worker restarts; and whether it is flat:
       its growth over the last half of the measured time (median of the last three samples against the median of
       the three around the middle) within `--flat-mb` (2 MB). The caches that fill while sessions come and go
       are bounded (docs/adr/0012-proxy-workers.md lists them): a longer soak shows them reach their bound.

  mem  issue 32 point 4: the RSS growth of one 100,000-item (≈5 MB) request and of `--mem-streams` (2) distinct
       streaming sessions of that size, each once the proxy is idle, and after `--mem-idle` seconds without traffic;
       whether that last growth is within `--mem-tolerance` MB ("nothing after").

  stall  an upstream that goes silent (`--stalls` times mid-stream after 4 events, and as many times
       before sending headers) behind ctproxy with `timeouts.stream_idle_seconds` = `--idle-timeout`:
       how long the agent waits until it gets the error (SSE `error` event / 504 JSON) against the
       configured timeout, what it got, and whether the upstream connection was closed.

Everything runs on loopback against the emulator (tests/emulator) in its own process; the figures are
printed and written to bench/results/soak.json.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Processes, Service, print_table, summarize, write_result

TURNS_PER_CONVERSATION = 6


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_idle(pid: int, limit: float = 180.0) -> float:
    """Seconds until the process has used under 2% of a CPU for 2 s (its background work is done)."""
    start = time.monotonic()
    last = cpu_seconds(pid)
    while time.monotonic() - start < limit:
        await asyncio.sleep(2.0)
        now = cpu_seconds(pid)
        if now - last < 0.04:
            break
        last = now
    return time.monotonic() - start


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak(pid: int) -> bool:
    """Start the kernel's RSS high-water mark (VmHWM) afresh (Linux ≥ 4.0; False where it may not be written)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def _stream_once(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> str:
    """One streamed turn; returns the assistant text (so the next turn can resend it)."""
    text: list[str] = []
    async with http.post(url + "/v1/responses", data=orjson.dumps(body),
                         headers={"content-type": "application/json", "authorization": "Bearer sk-bench"}) as r:
        r.raise_for_status()
        async for raw in r.content:
            if raw.startswith(b"data: {") and b'"response.output_text.delta"' in raw:
                text.append(orjson.loads(raw[6:]).get("delta", ""))
    return "".join(text)


async def _client(http: aiohttp.ClientSession, url: str, n: int, stop_at: float, counts: dict[str, int]) -> None:
    conv = 0
    while time.monotonic() < stop_at:
        conv += 1
        history: list[dict[str, Any]] = []
        for turn in range(TURNS_PER_CONVERSATION):
            if time.monotonic() >= stop_at:
                return
            history.append({"role": "user", "content": f"client {n} conversation {conv} turn {turn}: " + "w " * 200})
            try:
                answer = await _stream_once(http, url, {"model": "gpt-5", "stream": True, "input": history})
                counts["requests"] += 1
            except (aiohttp.ClientError, TimeoutError):
                counts["errors"] += 1
                break
            history.append({"type": "message", "role": "assistant",
                            "content": [{"type": "output_text", "text": answer}]})


async def soak(svc: Service, clients: int, seconds: float, warmup: float, idle: float) -> dict[str, Any]:
    url, pid = svc.url, svc.proc.pid
    counts = {"requests": 0, "errors": 0}
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    stop_at = start + warmup + seconds
    conn = aiohttp.TCPConnector(limit=clients * 2)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        tasks = [asyncio.create_task(_client(http, url, n, stop_at, counts)) for n in range(clients)]
        while time.monotonic() < stop_at:
            samples.append((time.monotonic() - start, rss_mb(pid)))
            await asyncio.sleep(1.0)
        await asyncio.gather(*tasks)
    end_rss = rss_mb(pid)
    await asyncio.sleep(idle)
    after_idle = rss_mb(pid)
    measured = [(t, m) for t, m in samples if t >= warmup]
    at_warm = statistics.median(m for t, m in measured[:3]) if measured else float("nan")
    last = statistics.median(m for t, m in measured[-3:]) if measured else float("nan")
    slope = _slope(measured) * 60 if len(measured) > 2 else float("nan")
    return {"requests": counts["requests"], "errors": counts["errors"], "rss_start": round(samples[0][1], 1),
            "rss_after_warmup": round(at_warm, 1), "rss_end": round(last, 1), "rss_after_idle": round(after_idle, 1),
            "growth_after_warmup": round(last - at_warm, 1), "slope_mb_per_min": round(slope, 2),
            "rss_end_exact": round(end_rss, 1)}


def _slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope (MB per second) of RSS over time."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def _worker_pids(state: Path) -> dict[str, int]:
    """'worker N' → pid of each worker of a `ctproxy up --workers N`, from its run.json (as `ctproxy status`)."""
    import json

    try:
        run = json.loads((state / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    return {f"worker {w['index']}": int(w["pid"]) for w in run.get("workers") or []}


async def soak_workers(svc: Service, state: Path, clients: int, seconds: float, warmup: float, idle: float,
                       every: float) -> dict[str, Any]:
    """The soak through a `--workers N` proxy, the RSS of each worker and of the supervisor sampled every `every` s."""
    counts = {"requests": 0, "errors": 0}
    samples: dict[str, list[tuple[float, float]]] = {}
    pids_seen: dict[str, set[int]] = {}

    def sample(now: float) -> None:
        for name, pid in {"supervisor": svc.proc.pid, **_worker_pids(state)}.items():
            pids_seen.setdefault(name, set()).add(pid)
            try:
                samples.setdefault(name, []).append((now, rss_mb(pid)))
            except OSError:  # a worker being restarted
                pass

    start = time.monotonic()
    stop_at = start + warmup + seconds
    conn = aiohttp.TCPConnector(limit=clients * 2)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=120)) as http:
        tasks = [asyncio.create_task(_client(http, svc.url, n, stop_at, counts)) for n in range(clients)]
        while time.monotonic() < stop_at:
            sample(time.monotonic() - start)
            await asyncio.sleep(every)
        await asyncio.gather(*tasks)
    await asyncio.sleep(idle)
    sample(time.monotonic() - start)
    out: dict[str, Any] = {"requests": counts["requests"], "errors": counts["errors"], "processes": {}}
    for name, points in samples.items():
        measured = [(t, m) for t, m in points[:-1] if t >= warmup]
        if not measured:
            continue
        mid = measured[len(measured) // 2][1]
        around_mid = [m for _, m in measured[max(0, len(measured) // 2 - 1):len(measured) // 2 + 2]]
        last_half = statistics.median(m for _, m in measured[-3:]) - statistics.median(around_mid)
        out["processes"][name] = {
            "pids": sorted(pids_seen[name]), "rss_first": round(points[0][1], 1),
            "rss_after_warmup": round(measured[0][1], 1), "rss_middle": round(mid, 1),
            "rss_end": round(measured[-1][1], 1), "rss_after_idle": round(points[-1][1], 1),
            "growth_after_warmup": round(measured[-1][1] - measured[0][1], 1),
            "slope_mb_per_min": round(_slope(measured) * 60, 2) if len(measured) > 2 else float("nan"),
            "growth_last_half": round(last_half, 1), "samples": len(measured)}
    return out


async def _tiny(http: aiohttp.ClientSession, url: str) -> float:
    t0 = time.perf_counter()
    async with http.post(url + "/v1/responses", data=b'{"model":"gpt-5","input":"ping"}',
                         headers={"content-type": "application/json", "authorization": "Bearer sk-bench"}) as r:
        await r.read()
    return time.perf_counter() - t0


async def big(svc: Service, items: int, rounds: int, idle_samples: int) -> dict[str, Any]:
    """`rounds` big requests, each a new session (agents' first turn after a restart, or sub-agents)."""
    url, pid = svc.url, svc.proc.pid
    idle: list[float] = []
    during: list[float] = []
    big_seconds: list[float] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        idle += [await _tiny(http, url) for _ in range(idle_samples)]
        rss_before = rss_mb(pid)
        for r in range(rounds):
            inp = [{"type": "message", "role": "user" if i % 2 == 0 else "assistant", "content": f"s{r} item {i}"}
                   for i in range(items)]
            body = orjson.dumps({"model": "gpt-5", "input": inp})
            t0 = time.perf_counter()

            async def send_big(body: bytes = body, t0: float = t0) -> float:
                async with http.post(url + "/v1/responses", data=body, headers={
                        "content-type": "application/json", "authorization": "Bearer sk-bench"}) as resp:
                    await resp.read()
                    resp.raise_for_status()
                return time.perf_counter() - t0

            big_task = asyncio.create_task(send_big())
            tiny_tasks = []
            while not big_task.done():  # open loop: a tiny request every 50 ms, back or not
                tiny_tasks.append(asyncio.create_task(_tiny(http, url)))
                await asyncio.sleep(0.05)
            during += await asyncio.gather(*tiny_tasks)
            big_seconds.append(await big_task)
            idle += [await _tiny(http, url) for _ in range(idle_samples)]  # the journal settles meanwhile
        rss_busy = rss_mb(pid)
        settled_after = await wait_idle(pid)
        rss_after = rss_mb(pid)
    s_idle, s_during = summarize(idle), summarize(during)
    return {"body_mb": round(len(body) / 2**20, 2), "rounds": rounds,
            "big_seconds_median": round(statistics.median(big_seconds), 3),
            "tiny_idle_ms": s_idle.ms(), "tiny_during_ms": s_during.ms(),
            "rss_before": round(rss_before, 1), "rss_right_after": round(rss_busy, 1),
            "settled_after_s": round(settled_after, 1), "rss_after": round(rss_after, 1)}


async def stall(procs: Processes, stalls: int, idle_timeout: float) -> dict[str, Any]:
    from tests.emulator import Emulator, Text

    config = procs.workdir / "stall-config.json"
    config.write_text(orjson.dumps({"timeouts": {"stream_idle_seconds": idle_timeout}}).decode())
    waits: dict[str, list[float]] = {"mid-stream": [], "before headers": []}
    got: dict[str, set[str]] = {"mid-stream": set(), "before headers": set()}
    closed = 0
    async with Emulator() as emu, aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
        svc = procs.ctproxy(emu.url, extra_args=["--config", str(config)], with_tools=False)
        for kind in waits:
            for _ in range(stalls):
                if kind == "mid-stream":
                    emu.script(Text("hello there, world", deltas=6, stall_after=4))
                else:
                    emu.script(Text("never sent", stall_before_headers=True))
                before = len(emu.responses_requests)
                t0 = time.perf_counter()
                async with http.post(svc.url + "/v1/responses", data=b'{"model":"gpt-5","input":"hi","stream":true}',
                                     headers={"content-type": "application/json"}) as r:
                    raw = await r.read()
                waits[kind].append(time.perf_counter() - t0)
                if r.status == 504:
                    got[kind].add(f"{r.status} {orjson.loads(raw)['error']['code']}")
                else:
                    events = [orjson.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
                    got[kind].add(f"{r.status} {events[-1].get('type')} {events[-1].get('code')}" if events else "none")
                rec = emu.responses_requests[before]
                deadline = time.monotonic() + 30
                while not rec.client_disconnected and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                closed += bool(rec.client_disconnected)
        svc.stop()
    return {"idle_timeout_s": idle_timeout, "stalls": 2 * stalls, "upstream_closed": closed,
            **{f"{k} wait_s": summarize(v).ms() for k, v in waits.items()},
            **{f"{k} agent got": sorted(v) for k, v in got.items()}}


async def _probe(pid: int, probe: Path | None, tag: str) -> dict[str, Any] | None:
    """Ask bench/memprobe.py inside the proxy for its report `tag` (`--mem-probe`); None without a probe."""
    if probe is None:
        return None
    (probe / "cmd").write_text(tag)
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 600
    while not (probe / f"{tag}.done").exists() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return orjson.loads((probe / f"{tag}.json").read_bytes())


async def mem(svc: Service, items: int, idle: float, streams: int = 2, probe: Path | None = None) -> dict[str, Any]:
    """Issue 32, point 4: one ~5 MB request of `items` items (JSON answer), then `streams` distinct streaming
    sessions of that size, one after the other (growth that stays would add up session after session). The proxy's
    RSS over its idle baseline right after each, and once it has been idle for `idle` seconds
    (the journal lets big idle sessions go after 30 s)."""
    url, pid = svc.url, svc.proc.pid
    rows: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await _tiny(http, url)
        await wait_idle(pid)
        base = rss_mb(pid)
        await _probe(pid, probe, "base")
        for tag, stream in [("json", False), *((f"stream-{n + 1}", True) for n in range(streams))]:
            inp = [{"type": "message", "role": "user" if i % 2 == 0 else "assistant", "content": f"{tag} item {i}"}
                   for i in range(items)]
            body = orjson.dumps({"model": "gpt-5", "input": inp, "stream": stream})
            del inp
            peak_known = reset_peak(pid)  # the growth while the request is in flight, not only what settles
            async with http.post(url + "/v1/responses", data=body, headers={
                    "content-type": "application/json", "authorization": "Bearer sk-bench"}) as resp:
                await resp.read()
                resp.raise_for_status()
            await wait_idle(pid)
            rows.append({"request": tag, "body_mb": round(len(body) / 2**20, 2),
                         "peak_growth_mb": round(rss_mb(pid, "VmHWM") - base, 1) if peak_known else None,
                         "rss_growth_mb": round(rss_mb(pid) - base, 1)})
        await asyncio.sleep(idle)
        after = round(rss_mb(pid) - base, 1)
        report = await _probe(pid, probe, "after")
    out = {"rss_base_mb": round(base, 1), "requests": rows, "idle_s": idle, "rss_growth_after_idle_mb": after}
    if report is not None:
        out["probe"] = {k: report.get(k) for k in ("arenas_seen", "sparse_arenas", "sparse_blocks", "used_bytes")}
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"args": vars(args)}
    with Processes() as procs:
        emu = procs.emulator(stream_deltas=24, json_deltas=3, max_recorded=2)
        if "rss" in args.only:
            out["rss"] = {}
            for label, extra in (("ctproxy defaults", []), ("pass-through (--disable all)", ["--disable", "all"])):
                svc = procs.ctproxy(emu.url, extra_args=extra, with_tools=False)
                print(f"rss: {label}: {args.clients} clients, {args.warmup:.0f} s warm-up + {args.seconds:.0f} s …",
                      flush=True)
                out["rss"][label] = await soak(svc, args.clients, args.seconds, args.warmup, args.idle)
                svc.stop()
            keys = list(next(iter(out["rss"].values())))
            print_table(["rss (MB)", *out["rss"]], [[k, *(r[k] for r in out["rss"].values())] for k in keys])
        if "workers" in args.only:
            svc = procs.ctproxy(emu.url, extra_args=["--workers", str(args.workers)], with_tools=False)
            state = procs.workdir / f"state-{svc.port}"
            print(f"workers: --workers {args.workers}, {args.clients} clients, {args.warmup:.0f} s warm-up + "
                  f"{args.seconds:.0f} s, RSS every {args.sample_every:.0f} s …", flush=True)
            res = out["workers"] = await soak_workers(svc, state, args.clients, args.seconds, args.warmup, args.idle,
                                                      args.sample_every)
            svc.stop()
            procs_ = res["processes"]
            keys = ["pids", "rss_after_warmup", "rss_middle", "rss_end", "rss_after_idle", "growth_after_warmup",
                    "slope_mb_per_min", "growth_last_half", "samples"]
            for r in procs_.values():
                r["flat"] = "yes" if abs(r["growth_last_half"]) <= args.flat_mb else "NO"
            print_table(["rss (MB)", *procs_], [[k, *(r[k] for r in procs_.values())] for k in [*keys, "flat"]])
            print(f"requests {res['requests']}, errors {res['errors']}; flat = growth over the last half of the "
                  f"{args.seconds:.0f} s within ±{args.flat_mb} MB")
        if "big" in args.only:
            svc = procs.ctproxy(emu.url, with_tools=False)
            print(f"big: {args.rounds} × one {args.items:,}-item request, a tiny request every 50 ms …", flush=True)
            res = out["big"] = await big(svc, args.items, args.rounds, args.idle_samples)
            idle_ms, during_ms = res["tiny_idle_ms"], res["tiny_during_ms"]
            print_table(["big", "value"], [
                ["body MB", res["body_mb"]], ["big requests (new sessions)", res["rounds"]],
                ["big request s, median", res["big_seconds_median"]],
                ["tiny idle median / p99 ms", f"{idle_ms['median']} / {idle_ms['p99']}"],
                ["tiny during median/p99/max ms", f"{during_ms['median']} / {during_ms['p99']} / {during_ms['max']}"],
                ["tiny during n", during_ms["n"]],
                ["proxy RSS before / right after MB", f"{res['rss_before']} / {res['rss_right_after']}"],
                ["proxy idle (journal settled) after s", res["settled_after_s"]],
                ["proxy RSS when idle MB", res["rss_after"]]])
        if "mem" in args.only:
            probe = None
            if args.mem_probe:  # bench/memprobe.py loaded into the proxy (bench/memprobe_site/sitecustomize.py)
                probe = Path(args.mem_probe).resolve()
                probe.mkdir(parents=True, exist_ok=True)
                for old in probe.glob("*.done"):
                    old.unlink()
                site = Path(__file__).resolve().parent / "memprobe_site"
                procs.env = {**procs.env, "CTP_MEMPROBE": str(probe),
                             "PYTHONPATH": f"{procs.env['PYTHONPATH']}{os.pathsep}{site}"}
            svc = procs.ctproxy(emu.url, extra_args=[a for name in args.mem_disable for a in ("--disable", name)],
                                with_tools=False)
            print(f"mem: one {args.items:,}-item request, then {args.mem_streams} such streaming sessions …",
                  flush=True)
            res = out["mem"] = await mem(svc, args.items, args.mem_idle, args.mem_streams, probe)
            res["nothing_after"] = res["rss_growth_after_idle_mb"] <= args.mem_tolerance
            print_table(["mem", "body MB", "RSS growth MB (peak in flight)", "RSS growth MB (settled)"],
                        [[r["request"], r["body_mb"], r["peak_growth_mb"], r["rss_growth_mb"]]
                         for r in res["requests"]]
                        + [[f"after {args.mem_idle:.0f} s idle", "", "", res["rss_growth_after_idle_mb"]]])
            print(f"after idle within {args.mem_tolerance} MB of the baseline: "
                  f"{'yes' if res['nothing_after'] else 'NO'}")
            if probe is not None:
                print(f"probe (after idle): {res['probe']}; reports in {probe}")
            svc.stop()
        if "stall" in args.only:
            print(f"stall: {2 * args.stalls} stalled answers, idle timeout {args.idle_timeout} s …", flush=True)
            res = out["stall"] = await stall(procs, args.stalls, args.idle_timeout)
            rows = [["idle timeout s", res["idle_timeout_s"]],
                    ["upstream connections closed", f"{res['upstream_closed']} of {res['stalls']}"]]
            for kind in ("mid-stream", "before headers"):
                w = res[f"{kind} wait_s"]
                waited = f"{w['median'] / 1000:.2f} / {w['max'] / 1000:.2f}"
                rows += [[f"{kind}: agent waited s (median / max)", waited],
                         [f"{kind}: agent got", ", ".join(res[f"{kind} agent got"])]]
            print_table(["stall", "value"], rows)
    path = write_result("soak", out)
    print(f"written: {path}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=["rss", "workers", "big", "mem", "stall"],
                        default=["rss", "big", "mem", "stall"])
    parser.add_argument("--mem-streams", type=int, default=2,
                        help="mem: distinct streaming sessions after the JSON one")
    parser.add_argument("--mem-idle", type=float, default=45.0, help="mem: idle seconds before the last RSS sample")
    parser.add_argument("--mem-probe", metavar="DIR",
                        help="mem: load bench/memprobe.py into the proxy; its reports (base, after) go to DIR")
    parser.add_argument("--mem-disable", action="append", default=[], metavar="NAME",
                        help="mem: `ctproxy up --disable NAME` (repeatable), to see what a capability leaves behind")
    parser.add_argument("--mem-tolerance", type=float, default=10.0,
                        help="mem: RSS over the idle baseline (MB) that still counts as nothing left after")
    parser.add_argument("--flat-mb", type=float, default=2.0,
                        help="workers: growth (MB) over the last half of the soak that still counts as flat")
    parser.add_argument("--stalls", type=int, default=5, help="stalled answers of each kind")
    parser.add_argument("--idle-timeout", type=float, default=2.0, help="timeouts.stream_idle_seconds for stall")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=60.0, help="measured soak after the warm-up")
    parser.add_argument("--warmup", type=float, default=20.0)
    parser.add_argument("--idle", type=float, default=10.0, help="pause after the soak before the last sample")
    parser.add_argument("--workers", type=int, default=2, help="workers: `ctproxy up --workers N`")
    parser.add_argument("--sample-every", type=float, default=5.0, help="workers: seconds between RSS samples")
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5, help="big requests, each a new session")
    parser.add_argument("--idle-samples", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="10 clients, 10 s + 5 s warm-up, 20k items")
    args = parser.parse_args()
    if args.quick:
        args.clients, args.seconds, args.warmup, args.idle, args.items, args.rounds = 10, 10.0, 5.0, 2.0, 20_000, 2
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
