"""Instructions per request: bare mitmdump vs `ctproxy up` (and earlier checkouts), counted by valgrind.

    .venv/bin/python bench/bench_instructions.py [--quick] [--body small|big|sse] [--requests N]
                                                 [--variant LABEL='@DIR ARGS'] [--threads]

Latency and CPU time on a shared machine move by ±0.2 ms between runs (steal time, frequency), more than the
differences a change to the request path makes on bench_proxy's 10 KB request. The number of instructions a
process executes for the same requests does not: under callgrind it repeats within ±0.3 % from run to run. Each
target runs under `valgrind --tool=callgrind` with instrumentation off while it starts (the start is not counted,
and is not slowed much); after warm-up requests it is switched on (`callgrind_control -i on`), the requests are
sent one at a time, and the counts of every thread of the process are summed. What this does not see: where the
work lands in time (a request's own path or a background thread later, and how the threads hand the GIL to each
other) and cache misses; `--threads` prints each thread's share, where thread 1 is the event loop (the request
path). bench_proxy.py's latencies stay the final word; this says whether the work itself grew.

Targets: `bare` (mitmdump, no addons: the baseline the ratios are of), `ctproxy` (defaults), `pass-through`
(`--disable all`) and every `--variant` (an ARGS starting with `@DIR` runs the checkout in DIR, as in
bench_proxy.py). Needs valgrind (Debian: `apt-get install valgrind`); without it the bench says it skipped.
Written: bench/results/instructions.json.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_proxy import EVENTS, HEADERS, PASS, make_bodies
from bench.common import Processes, Service, print_table, ratio, write_result

WARMUP = 20
START_UNDER_VALGRIND = 300.0  # seconds: a Python process starts several times slower under valgrind
SETTLE = 2.0  # seconds after the last request before counting stops: the background writers finish their share


def valgrind_wrap(out_dir: Path, label: str) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
            f"--callgrind-out-file={out_dir / label}.%p.out"]


def _control(svc: Service, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(svc.proc.pid)], capture_output=True, check=False, timeout=120)


def thread_totals(out_dir: Path, label: str, pid: int) -> dict[int, int]:
    """Thread number → instructions counted, from callgrind's dump files of the process (one per thread)."""
    totals: dict[int, int] = {}
    for path in out_dir.glob(f"{label}.{pid}.out*"):
        thread, total = 1, 0
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("thread:"):
                thread = int(line.split()[1])
            elif line.startswith("totals:"):
                total = int(line.split()[1])
        if total:
            totals[thread] = totals.get(thread, 0) + total
    return totals


async def _send(http: aiohttp.ClientSession, url: str, body: bytes, n: int) -> None:
    for _ in range(n):
        async with http.post(url, data=body, headers=HEADERS) as resp:
            await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"{url} answered {resp.status}")


async def count(svc: Service, label: str, out_dir: Path, body: bytes, n: int) -> dict[int, int]:
    url = f"{svc.url}/v1/responses"
    async with aiohttp.ClientSession() as http:
        await _send(http, url, body, WARMUP)
        await asyncio.sleep(SETTLE)
        _control(svc, "-i", "on")
        await _send(http, url, body, n)
        await asyncio.sleep(SETTLE)
        _control(svc, "-i", "off")
        _control(svc, "-d")
    svc.stop(120)
    return thread_totals(out_dir, label, svc.proc.pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 requests per target instead of 200")
    parser.add_argument("--body", choices=("small", "big", "sse"), default="small",
                        help="bench_proxy's a (10 KB), b (1.5 MB) or c (200-event stream) request (default small)")
    parser.add_argument("--requests", type=int, default=None, help="requests counted per target")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=ARGS",
                        help="another ctproxy column: LABEL='--disable web_search' or LABEL='@DIR' (a checkout)")
    parser.add_argument("--threads", action="store_true", help="print each thread's instructions too")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("bench_instructions: skipped: valgrind is not installed (Debian: apt-get install valgrind)")
        return 0  # (an optional tool: `python -m bench` goes on with the others)
    n = args.requests or (40 if args.quick else 200)
    bodies = make_bodies()
    body = {"small": bodies.small, "big": bodies.big, "sse": bodies.sse}[args.body]
    variants: dict[str, list[str]] = {}
    for spec in args.variant:
        label, _, rest = spec.partition("=")
        variants[label] = shlex.split(rest)
    result: dict[str, Any] = {"body": args.body, "requests": n, "events": EVENTS, "targets": {}}
    with Processes() as procs:
        out_dir = procs.workdir / "callgrind"
        out_dir.mkdir()
        emu = procs.emulator(stream_deltas=EVENTS - 8)
        starts = {"bare": lambda w: procs.mitmdump(emu.url, wrap=w, start_timeout=START_UNDER_VALGRIND),
                  "ctproxy": lambda w: procs.ctproxy(emu.url, wrap=w, start_timeout=START_UNDER_VALGRIND),
                  PASS: lambda w: procs.ctproxy(emu.url, extra_args=["--disable", "all"], wrap=w,
                                                start_timeout=START_UNDER_VALGRIND)}
        for label, vargs in variants.items():
            tree = Path(vargs[0][1:]) if vargs and vargs[0].startswith("@") else None
            extra = vargs[1:] if tree else vargs
            starts[label] = (lambda w, extra=extra, tree=tree:
                             procs.ctproxy(emu.url, extra_args=extra, tree=tree, wrap=w,
                                           start_timeout=START_UNDER_VALGRIND))
        for label, start in starts.items():  # one at a time: counting does not depend on load, time does
            t0 = time.monotonic()
            svc = start(valgrind_wrap(out_dir, label))
            threads = asyncio.run(count(svc, label, out_dir, body, n))
            result["targets"][label] = {"per_request": sum(threads.values()) / n,
                                        "threads": {str(k): v / n for k, v in sorted(threads.items())}}
            print(f"  {label}: counted in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    bare = result["targets"]["bare"]["per_request"]
    rows = []
    for label, t in result["targets"].items():
        main_thread = t["threads"].get("1", 0.0)
        rows.append([label, f"{t['per_request'] / 1e6:.3f}", f"{main_thread / 1e6:.3f}",
                     f"{(t['per_request'] - main_thread) / 1e6:.3f}", f"{ratio(t['per_request'], bare):.3f}"])
        if args.threads:
            for k, v in t["threads"].items():
                rows.append([f"    thread {k}", f"{v / 1e6:.3f}", "", "", ""])
    print(f"bench_instructions: {n} requests per target ({args.body} body), millions of instructions per request")
    print_table(["target", "all threads", "event loop", "other threads", "×bare"], rows)
    write_result("instructions", result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
