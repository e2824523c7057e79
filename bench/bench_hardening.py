"""Issue 10, points 2 and 4: what the body bound saves, and what watching the upstream costs.

1. A decompression bomb (the issue's case: 128 MiB of JSON in ~127 KiB of gzip; also zstd and br), decoded
   in process by mitmproxy's decoder (what flowbody used) and by the bounded decoder with the default
   64 MiB limit: CPU time and peak traced memory.
2. The HttpStream wrapper (proxy/host/httpstream.py: JSON errors, connect and idle timers) on the hot path:
   mitmdump with only the wrapper installed (`-s`) against mitmdump with an empty `-s` script (what a
   script costs by itself) and bare mitmdump, all in reverse mode to the emulator,
   streamed turns (192 deltas) and small JSON turns, interleaved round-robin: medians of the client's
   wall-clock times and the proxy process's CPU per turn (from /proc). A shared machine: read the ratios,
   which come from one run.

    python bench/bench_hardening.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import sys
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import brotli  # noqa: E402
import orjson  # noqa: E402
import zstandard  # noqa: E402

from bench.common import Processes, print_table, ratio, round_robin, summarize  # noqa: E402

MIB = 1024 * 1024
WRAPPER_ONLY = '''\
"""mitmdump -s: only ctproxy's HttpStream wrapper, with the default timeouts (no ctproxy runtime)."""
from proxy import httpstream

httpstream._settings = lambda: (httpstream.DEFAULT_CONNECT_SECONDS, httpstream.DEFAULT_IDLE_SECONDS)
httpstream.install()
'''


def _measure(fn) -> tuple[float, int, str]:
    tracemalloc.start()
    start = time.process_time()
    try:
        fn()
        outcome = "decoded"
    except Exception as exc:  # BodyTooLarge for the bounded decoder
        outcome = type(exc).__name__
    cpu = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return cpu, peak, outcome


def bomb_figures() -> list[list[str]]:
    from mitmproxy.net import encoding

    from proxy.host.flowbody import DEFAULT_MAX_BODY_BYTES, decode_bounded

    payload = orjson.dumps({"model": "gpt-5", "input": "a" * (128 * MIB)})
    bombs = {
        "gzip": gzip.compress(payload, compresslevel=9),
        "zstd": zstandard.ZstdCompressor(level=19).compress(payload),
        "br": brotli.compress(payload, quality=5),
    }
    del payload
    rows = []
    for enc, raw in bombs.items():
        for name, fn in (("mitmproxy decode", lambda r=raw, e=enc: encoding.decode(r, e)),
                         ("bounded (64 MiB)", lambda r=raw, e=enc: decode_bounded(r, e, DEFAULT_MAX_BODY_BYTES))):
            encoding._cache = encoding.CachedDecode(None, None, None, None)  # each run starts cold
            cpu, peak, outcome = _measure(fn)
            rows.append([enc, f"{len(raw) / 1024:.0f} KiB", name, outcome, f"{cpu * 1000:.0f} ms",
                         f"{peak / MIB:.1f} MiB"])
        encoding._cache = encoding.CachedDecode(None, None, None, None)
    return rows


HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


async def _stream_turn(http: aiohttp.ClientSession, url: str, body: bytes) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    async with http.post(url, data=body, headers=HEADERS) as resp:
        async for _chunk in resp.content.iter_any():
            if first is None:
                first = time.perf_counter() - start
    if resp.status != 200 or first is None:
        raise RuntimeError(f"HTTP {resp.status}")
    return first, time.perf_counter() - start


async def _json_turn(http: aiohttp.ClientSession, url: str, body: bytes) -> float:
    start = time.perf_counter()
    async with http.post(url, data=body, headers=HEADERS) as resp:
        await resp.read()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}")
    return time.perf_counter() - start


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wrapper_figures(rounds: int, json_rounds: int) -> list[list[str]]:
    with Processes() as procs:
        script = procs.workdir / "wrapper_only.py"
        script.write_text(WRAPPER_ONLY)
        emu = procs.emulator(stream_deltas=192)
        empty = procs.workdir / "empty.py"
        empty.write_text('"""mitmdump -s: nothing (what loading a script costs by itself)."""\n')
        services = {"bare mitmdump": procs.mitmdump(emu.url),
                    "mitmdump -s empty.py": procs.mitmdump(emu.url, scripts=[empty]),
                    "mitmdump -s wrapper": procs.mitmdump(emu.url, scripts=[script])}
        urls = {name: svc.url + "/v1/responses" for name, svc in services.items()}
        stream_body = orjson.dumps({"model": "gpt-5", "input": "hello", "stream": True})
        json_body = orjson.dumps({"model": "gpt-5", "input": "hello"})
        async with aiohttp.ClientSession() as http:
            await round_robin(urls, 5, lambda _k, u: _stream_turn(http, u, stream_body))
            cpu0 = {name: cpu_seconds(svc.proc.pid) for name, svc in services.items()}
            streamed = await round_robin(urls, rounds, lambda _k, u: _stream_turn(http, u, stream_body))
            cpu1 = {name: cpu_seconds(svc.proc.pid) for name, svc in services.items()}
            await round_robin(urls, 5, lambda _k, u: _json_turn(http, u, json_body))
            small = await round_robin(urls, json_rounds, lambda _k, u: _json_turn(http, u, json_body))
            cpu2 = {name: cpu_seconds(svc.proc.pid) for name, svc in services.items()}
    rows = []
    figures: dict[str, dict[str, float]] = {}
    for name in urls:
        ttfb = summarize([s[0] for s in streamed[name]])
        ttlb = summarize([s[1] for s in streamed[name]])
        js = summarize(small[name])
        cpu_stream = (cpu1[name] - cpu0[name]) / rounds
        cpu_json = (cpu2[name] - cpu1[name]) / json_rounds
        figures[name] = {"ttfb": ttfb.median, "ttlb": ttlb.median, "json": js.median, "cpu_stream": cpu_stream,
                         "cpu_json": cpu_json}
        rows.append([name, f"{ttfb.median * 1000:.2f} ms", f"{ttlb.median * 1000:.2f} ms",
                     f"{cpu_stream * 1000:.2f} ms", f"{js.median * 1000:.2f} ms", f"{cpu_json * 1000:.2f} ms"])
    a, b = figures["mitmdump -s wrapper"], figures["mitmdump -s empty.py"]
    rows.append(["ratio wrapper / empty.py", *(f"{ratio(a[k], b[k]):.3f}" if b[k] else "-"
                                               for k in ("ttfb", "ttlb", "cpu_stream", "json", "cpu_json"))])
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    args = parser.parse_args(argv)
    print("1. a 128 MiB JSON body as a compressed bomb, decoded in process")
    print_table(["encoding", "sent", "decoder", "outcome", "CPU", "peak memory"], bomb_figures())
    rounds, json_rounds = (15, 50) if args.quick else (150, 300)
    print(f"\n2. the HttpStream wrapper on the hot path ({rounds} streamed and {json_rounds} JSON turns per target, "
          "round-robin)")
    print_table(["target", "stream TTFB", "stream total", "proxy CPU/stream", "JSON turn", "proxy CPU/JSON"],
                asyncio.run(wrapper_figures(rounds, json_rounds)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
