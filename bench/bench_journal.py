"""The journal's costs, measured against baselines in the same run.

1. Request-path overhead: two real mitmproxy processes against one emulator process, the same
   addons (session + tap) with and without `addons/history.py`. Stateless conversations resend
   their whole history each turn (like Codex and the SDK); the two proxies get the same request
   alternately and the per-turn latency ratio (journal on / off) is reported as a median.
2. Search: `history_search_contents` (the tool, end to end) over 100,000 journaled items of one
   agent, for rare / frequent / absent / short queries, against a plain Python scan of the same
   items (read from the database, and already in memory), all in this run.
3. Crash-loss window: enqueue→commit latency of the writer's batches under a steady load; a
   SIGKILL loses at most what was enqueued but not yet committed.

    .venv/bin/python bench/bench_journal.py [--quick] [--turns 40 --conversations 6 --items 100000 --runs 15]
                                            [--gap-ms 30] [--skip overhead search crash]

`--gap-ms` idles after each request so that no proxy's background work (the journal's writer commits
one interval after an exchange) overlaps another proxy's measured turn on a small machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy.config import Config  # noqa: E402
from proxy.db import connect  # noqa: E402
from proxy.journal import Journal  # noqa: E402
from proxy.journal.excerpt import find_matches  # noqa: E402
from proxy.journal.writer import BATCH_INTERVAL, BATCH_SIZE, JournalWriter  # noqa: E402
from proxy.session import SessionIdentity  # noqa: E402
from proxy.state import StateDir  # noqa: E402
from tools_server.history import create_family  # noqa: E402
from tools_server.registry import CallContext, Services  # noqa: E402

MITMDUMP = Path(sys.executable).parent / "mitmdump"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited early")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"{what} did not listen")


def start_proxy(upstream: str, state: Path, with_history: bool, disabled: bool = False) -> tuple[subprocess.Popen, int]:
    port = free_port()
    scripts = ["addons/session.py", "addons/tap.py"] + (["addons/history.py"] if with_history else [])
    args = [str(MITMDUMP), "--mode", f"reverse:{upstream}", "--listen-host", "127.0.0.1", "--listen-port",
            str(port), "-q", "--set", f"ctp_state_dir={state}"] + (["--set", "ctp_disable=history"] if disabled else [])
    for s in scripts:
        args += ["-s", str(REPO / s)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc, "mitmdump")
    return proc, port


def cpu_seconds(proc: subprocess.Popen) -> float | None:
    """User + system CPU of a process so far (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def one_turn(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    items: list[dict] = []
    async with http.post(url, data=body, headers={"content-type": "application/json",
                                                  "authorization": "Bearer sk-bench"}) as resp:
        buf = b""
        async for chunk in resp.content.iter_any():
            buf += chunk
        for line in buf.split(b"\n"):
            if line.startswith(b"data: ") and b"response.output_item.done" in line:
                items.append(orjson.loads(line[6:])["item"])
    return time.perf_counter() - started, items


async def bench_overhead(turns: int, conversations: int, gap: float = 0.0) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-journal-"))
    emu_port = free_port()
    emu = subprocess.Popen([sys.executable, "-m", "tests.emulator", "--port", str(emu_port), "--deltas", "20",
                            "--max-recorded", "4"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(emu_port, emu, "emulator")
    upstream = f"http://127.0.0.1:{emu_port}"
    off, off_port = start_proxy(upstream, work / "off", with_history=False)
    on, on_port = start_proxy(upstream, work / "on", with_history=True)
    idle, idle_port = start_proxy(upstream, work / "idle", with_history=True, disabled=True)
    targets = {"direct": f"{upstream}/v1/responses", "off": f"http://127.0.0.1:{off_port}/v1/responses",
               "on": f"http://127.0.0.1:{on_port}/v1/responses", "idle": f"http://127.0.0.1:{idle_port}/v1/responses"}
    times: dict[str, list[float]] = {k: [] for k in targets}
    ratios: list[float] = []
    rng = random.Random(7)
    procs = {"off": off, "on": on, "idle": idle}
    cpu_start = {k: cpu_seconds(p) for k, p in procs.items()}
    cpu: dict[str, float | None] = {}
    try:
        async with aiohttp.ClientSession() as http:
            for c in range(conversations):
                history: list[dict] = [{"role": "developer", "content": "You are a careful agent. " * 40}]
                for t in range(turns):
                    words = " ".join(rng.choice(WORDS) for _ in range(60))
                    history.append({"role": "user", "content": f"conversation {c} turn {t}: {words}"})
                    body = orjson.dumps({"model": "gpt-5", "input": history, "stream": True})
                    order = ["off", "on", "idle", "direct"]
                    rng.shuffle(order)
                    got: dict[str, float] = {}
                    items: list[dict] = []
                    for name in order:
                        got[name], items = await one_turn(http, targets[name], body)
                        if gap:  # let each proxy's background work (the journal's writer) finish unmeasured
                            await asyncio.sleep(gap)
                    if t >= 2:  # the first turns warm up connections and caches
                        for k, v in got.items():
                            times[k].append(v)
                        ratios.append(got["on"] / got["off"])
                    history.extend(items)
        for k, p in procs.items():
            end, start = cpu_seconds(p), cpu_start[k]
            cpu[k] = None if end is None or start is None else (end - start) / (turns * conversations) * 1000
    finally:
        for p in (on, off, idle, emu):
            p.send_signal(signal.SIGTERM)
        for p in (on, off, idle, emu):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
    conn = connect(work / "on" / "ctproxy.db")
    journaled = conn.execute("SELECT count(*) FROM journal_items").fetchone()[0]
    conn.close()
    boot = random.Random(1)
    medians = sorted(statistics.median(boot.choices(ratios, k=len(ratios))) for _ in range(2000))
    return {"median_ms": {k: statistics.median(v) * 1000 for k, v in times.items()},
            "median_ratio_on_off": statistics.median(ratios),
            "ci95": (medians[50], medians[1949]),
            "idle_ratio": statistics.median(i / o for i, o in zip(times["idle"], times["off"], strict=True)),
            "ratio_of_medians": statistics.median(times["on"]) / statistics.median(times["off"]),
            "samples": len(ratios), "journaled_items": journaled, "history_len": len(history),
            "cpu_ms_per_turn": cpu}


VOCAB = ["the", "request", "proxy", "journal", "window", "agent", "notes", "history", "search", "item", "token",
         "model", "stream", "event", "context", "budget", "compaction", "branch", "session", "task", "patch",
         "shell", "output", "error", "retry", "cache", "index"]
WORDS = ("alpha", "beta", "gamma", "delta", "patch", "test")


def make_text(rng: random.Random, i: int) -> str:
    n = rng.randint(10, 300)
    words = [rng.choice(VOCAB) for _ in range(n)]
    if i % 10_000 == 17:
        words.insert(rng.randint(0, n), "zebracorn")  # rare: 10 items in 100,000
    if i % 100 == 3:
        words.insert(rng.randint(0, n), "Kubernetes")  # 1%
    return " ".join(words)


def build_journal(state: StateDir, items: int) -> tuple[str, str, float]:
    j = Journal(state, JournalWriter(state.db_path, batch_size=2048))
    key, task, addr = j.resolve(SessionIdentity("f:bench", "fingerprint", None, None), {}, {})
    st = j.session(key, task, addr)
    rng = random.Random(11)
    started = time.perf_counter()
    prev = None
    i = 0
    while i < items:
        batch = []
        for _ in range(min(99, items - i - 1)):
            batch.append({"role": "user" if i % 2 else "developer", "content": make_text(rng, i)})
            i += 1
        payload: dict = {"input": batch}
        if prev:
            payload["previous_response_id"] = prev
        mark = j.ingest_request(st, payload)
        prev = f"resp_{i}"
        j.ingest_response(mark, [{"type": "message", "id": f"msg_{i}", "role": "assistant", "status": "completed",
                                  "content": [{"type": "output_text", "text": make_text(rng, i)}]}],
                          response_id=prev, model="gpt-5", status="completed", usage=None, error=None,
                          incomplete=False)
        i += 1
    j.flush(timeout=None)
    j.close()
    return task, addr, time.perf_counter() - started


def python_scan(texts: list[tuple[str, list]], query: str, limit: int) -> int:
    hits = 0
    for text, segs in texts:
        if query in text and find_matches(text, segs, query):
            hits += 1
            if hits > limit:
                break
    return hits


async def bench_search(items: int, runs: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-journal-search-"))
    state = StateDir.open(work / "state")
    task, addr, build_s = build_journal(state, items)
    services = Services(Config(), state, work)
    fam = create_family(services)
    tool = {t.name: t for t in fam.tools()}["history_search_contents"]
    ctx = CallContext(services, task=task, agent=addr)
    conn = connect(state.db_path)
    rows_sql = ("SELECT i.text, i.segments FROM journal_branch b JOIN journal_items i ON i.item_id=b.item_id"
                " WHERE b.session_key=(SELECT session_key FROM journal_sessions WHERE task_id=? AND address=?)"
                " ORDER BY i.seq")
    count = conn.execute("SELECT count(*) FROM journal_items").fetchone()[0]
    memory = [(t, orjson.loads(s)) for t, s in conn.execute(rows_sql, (task, addr))]
    queries = {"rare (10 hits)": "zebracorn", "1% of items": "Kubernetes", "frequent": "journal window",
               "absent": "no such phrase", "2 chars (scan)": "zq"}
    out = {}
    for label, q in queries.items():
        tool_t, db_t, mem_t = [], [], []
        for _ in range(runs):
            t0 = time.perf_counter()
            res = await tool.call({"query": q}, ctx)
            tool_t.append(time.perf_counter() - t0)
            assert not res.is_error
            t0 = time.perf_counter()
            python_scan([(t, orjson.loads(s)) for t, s in conn.execute(rows_sql, (task, addr))], q, 20)
            db_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            python_scan(memory, q, 20)
            mem_t.append(time.perf_counter() - t0)
        out[label] = {"tool_ms": statistics.median(tool_t) * 1000, "scan_db_ms": statistics.median(db_t) * 1000,
                      "scan_memory_ms": statistics.median(mem_t) * 1000, "hits": res.details.get("items")}
    await fam.close()
    conn.close()
    return {"items": count, "build_s": build_s, "queries": out}


async def bench_crash_window(seconds: float) -> dict:
    """The proxy's request path (`begin_request` / `end_response`, on an event loop as in mitmproxy) under a
    steady load; the window counts from the moment a request or answer was handed over to its commit."""
    work = Path(tempfile.mkdtemp(prefix="bench-journal-crash-"))
    state = StateDir.open(work / "state")
    j = Journal(state, JournalWriter(state.db_path, keep_latencies=True))
    key, task, addr = j.resolve(SessionIdentity("f:crash", "fingerprint", None, None), {}, {})
    rng = random.Random(3)
    history: list[dict] = []
    path_t: list[float] = []
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:  # ~100 turns/s, each resending the whole conversation
        history.append({"role": "user", "content": make_text(rng, n)})
        out = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": f"ok {n}"}]}
        t0 = time.perf_counter()
        mark = j.begin_request(key, task, addr, "fingerprint", {"input": history})
        j.end_response(mark, [out], response_id=f"r{n}", model=None, status="completed", usage=None,
                       error=None, incomplete=False)
        path_t.append(time.perf_counter() - t0)
        history.append(out)
        n += 1
        await asyncio.sleep(0.01)
    j.flush(timeout=None)
    lat = sorted(j.writer.stats.latencies)
    stats = j.writer.stats
    j.close()
    return {"turns": n, "final_history": len(history), "batches": stats.batches, "ops": stats.ops,
            "max_batch": stats.max_batch,
            "commit_latency_ms": {"p50": lat[len(lat) // 2] * 1000, "p99": lat[int(len(lat) * 0.99)] * 1000,
                                  "max": lat[-1] * 1000},
            "request_path_us": {"median": statistics.median(path_t) * 1e6, "max": max(path_t) * 1e6}}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=40)
    ap.add_argument("--gap-ms", type=float, default=0.0,
                    help="idle time after each request, so no proxy's background work overlaps another's turn")
    ap.add_argument("--conversations", type=int, default=6)
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--crash-seconds", type=float, default=5.0)
    ap.add_argument("--skip", nargs="*", default=[], choices=["overhead", "search", "crash"])
    ap.add_argument("--quick", action="store_true", help="short runs: 20,000 items, fewer turns")
    args = ap.parse_args()
    if args.quick:
        args.turns, args.conversations, args.items, args.runs, args.crash_seconds = 20, 3, 20_000, 5, 2.0
    print(f"writer: commits within {BATCH_INTERVAL * 1000:.0f} ms of a hand-over, up to {BATCH_SIZE} ops a "
          f"transaction; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    if "crash" not in args.skip:
        c = await bench_crash_window(args.crash_seconds)
        print(f"\n[crash-loss window] {c['turns']} turns (history up to {c['final_history']} items), "
              f"{c['ops']} ops in {c['batches']} batches (max {c['max_batch']})")
        print("  handed over→committed, a batch's oldest request or answer: p50 {p50:.1f} ms, p99 {p99:.1f} ms, "
              "max {max:.1f} ms".format(**c["commit_latency_ms"]))
        print("  request path (begin_request + end_response, whole history resent): median {median:.0f} µs, "
              "max {max:.0f} µs".format(**c["request_path_us"]))
        print("  a SIGKILL loses at most what was handed over within that window (not yet committed)")
    if "overhead" not in args.skip:
        o = await bench_overhead(args.turns, args.conversations, args.gap_ms / 1000)
        m = o["median_ms"]
        print(f"\n[request-path overhead] {o['samples']} paired streamed turns, history up to {o['history_len']} "
              f"items, {o['journaled_items']} items journaled" + (f", {args.gap_ms:g} ms idle after each request"
                                                                  if args.gap_ms else ""))
        print(f"  median latency: direct {m['direct']:.2f} ms, proxy without journal {m['off']:.2f} ms, "
              f"with journal {m['on']:.2f} ms, history addon loaded but disabled {m['idle']:.2f} ms")
        lo, hi = o["ci95"]
        print(f"  journal on/off: median of paired ratios {o['median_ratio_on_off']:.3f} (95% CI {lo:.3f}-{hi:.3f}), "
              f"ratio of medians {o['ratio_of_medians']:.3f}  (target ≤ 1.05)")
        print(f"  addon loaded but disabled / off: median of paired ratios {o['idle_ratio']:.3f}")
        cpu = o["cpu_ms_per_turn"]
        if all(v is not None for v in cpu.values()):
            print(f"  proxy CPU per turn (all threads, /proc): without journal {cpu['off']:.2f} ms, with journal "
                  f"{cpu['on']:.2f} ms, addon disabled {cpu['idle']:.2f} ms")
    if "search" not in args.skip:
        s = await bench_search(args.items, args.runs)
        print(f"\n[search] {s['items']} journaled items (built in {s['build_s']:.1f} s); median of {args.runs} runs; "
              "FTS5 trigram candidates verified against the text; queries < 3 chars scan with instr()")
        for label, q in s["queries"].items():
            print(f"  {label:16s} tool {q['tool_ms']:7.2f} ms | python scan: from db {q['scan_db_ms']:8.2f} ms "
                  f"({q['scan_db_ms'] / q['tool_ms']:6.1f}x), in memory {q['scan_memory_ms']:7.2f} ms "
                  f"({q['scan_memory_ms'] / q['tool_ms']:5.1f}x) | {q['hits']} hits shown")


if __name__ == "__main__":
    asyncio.run(main())
