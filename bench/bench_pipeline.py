"""Benchmark: the whole addon chain on a 1.5 MB Responses request, against bare mitmdump, in one run.

    .venv/bin/python bench/bench_pipeline.py [--requests 30] [--size-mb 1.5]

Four processes are started: the emulator (the upstream), a bare `mitmdump` in reverse mode, and the
ctproxy launcher twice, trusting the emulator so the web search injection applies: with the full chain
(routing, session, tap, history, compaction, web_search, guard, body writer) and without this issue's
two addons (`chain w/o 6`), to attribute the cost. One client sends the same streamed 1.5 MB request
round-robin to each path and reads each answer to its end. Printed: median and p90 per path and the
ratios measured in this run.
A second section times the pure transforms on the same body in-process, against one orjson parse.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_payload(size_mb: float) -> dict:
    chunk = "The quick brown fox jumps over the lazy dog. " * 40  # ~1.8 KB per message
    items: list[dict] = []
    size = 0
    i = 0
    while size < size_mb * 1_000_000:
        role = "user" if i % 2 == 0 else "assistant"
        text = f"[{i}] {chunk}"
        items.append({"type": "message", "role": role, "content": text})
        size += len(text) + 40
        i += 1
    items.append({"type": "message", "role": "user", "content": "And now the question?"})
    return {"model": "gpt-4.1", "input": items, "stream": True, "store": False,
            "tools": [{"type": "function", "name": "get_weather", "description": "weather", "strict": True,
                       "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                      "required": ["city"], "additionalProperties": False}}]}


async def serve_chain(port: int, upstream: str, state: str, which: str) -> None:
    """Child mode: the launcher with the full chain, or without this issue's addons (`base`)."""
    import addons
    from proxy.app.launcher import UpOptions, run_up
    from tests.proxy.windows.test_compaction_harness import pipeline_chain

    full = pipeline_chain
    addons.chain = full if which == "full" else (
        lambda: [a for a in full() if type(a).__name__ not in ("Compaction", "WebSearch")])
    await run_up(UpOptions(listen_port=port, upstream=upstream, trust_upstream=True, with_tools=False,
                           state_dir=Path(state)))


async def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"a child exited early with {proc.returncode}")
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            await asyncio.sleep(0.1)
    raise SystemExit(f"nothing listens on {port}")


async def one(http, url: str, body: bytes, headers: dict) -> float:
    start = time.perf_counter()
    async with http.post(url, data=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise SystemExit(f"{url}: HTTP {resp.status}")
    return time.perf_counter() - start


def micro(payload: dict, rounds: int = 20) -> list[tuple[str, float]]:
    import orjson

    from proxy.items.canonical import chain_at
    from proxy.transforms.web_search import WebSearchSettings, inject_web_search
    from proxy.windows.remote.bootstraps import CompactionRecord, ProjectionContext, apply_projection

    raw = orjson.dumps(payload)
    items = payload["input"]
    rec = CompactionRecord("cp_bench", len(items) // 2, chain_at(items, "", len(items) // 2) or "", (),
                           {"type": "compaction", "encrypted_content": "x" * 512}, "fallback")

    def timeit(fn) -> float:
        samples = []
        for _ in range(rounds):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)

    base = timeit(lambda: orjson.loads(raw))
    return [
        ("orjson.loads (baseline)", base),
        ("inject_web_search", timeit(lambda: inject_web_search(payload, WebSearchSettings()))),
        ("apply_projection (hash chain over the prefix)",
         timeit(lambda: apply_projection(payload, ProjectionContext(rec, True)))),
        ("orjson.dumps", timeit(lambda: orjson.dumps(payload))),
    ]


async def main(args: argparse.Namespace) -> None:
    import aiohttp
    import orjson

    payload = make_payload(args.size_mb)
    body = orjson.dumps(payload)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench-not-a-key"}
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    tmp = tempfile.mkdtemp(prefix="ctproxy-bench-")
    procs: list[subprocess.Popen] = []
    try:
        emu_port, bare_port, base_port, chain_port = free_port(), free_port(), free_port(), free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.emulator", "--port", str(emu_port),
                                       "--max-recorded", "4"], cwd=REPO, env=env, stdout=subprocess.DEVNULL))
        emu = f"http://127.0.0.1:{emu_port}"
        mitmdump = shutil.which("mitmdump", path=str(Path(sys.executable).parent)) or "mitmdump"
        procs.append(subprocess.Popen([mitmdump, "-q", "--mode", f"reverse:{emu}", "--listen-host", "127.0.0.1",
                                       "--listen-port", str(bare_port), "--set", f"confdir={tmp}/bare"],
                                      cwd=REPO, env=env, stdout=subprocess.DEVNULL))
        for port, which in ((base_port, "base"), (chain_port, "full")):
            procs.append(subprocess.Popen([sys.executable, __file__, "--serve-chain", str(port), emu,
                                           f"{tmp}/state-{which}", which],
                                          cwd=REPO, env=env, stdout=subprocess.DEVNULL))
        for port, proc in zip((emu_port, bare_port, base_port, chain_port), procs, strict=True):
            await wait_port(port, proc)
        paths = {"direct": f"{emu}/v1/responses", "bare mitmdump": f"http://127.0.0.1:{bare_port}/v1/responses",
                 "chain w/o 6": f"http://127.0.0.1:{base_port}/v1/responses",
                 "ctproxy chain": f"http://127.0.0.1:{chain_port}/v1/responses"}
        times: dict[str, list[float]] = {k: [] for k in paths}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as http:
            for _ in range(3):  # warm-up: connections, the journal's first session load
                for url in paths.values():
                    await one(http, url, body, headers)
            for _ in range(args.requests):
                for name, url in paths.items():
                    times[name].append(await one(http, url, body, headers))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"request body: {len(body) / 1e6:.2f} MB, {len(payload['input'])} input items, streamed answer, "
          f"{args.requests} requests per path (round-robin, after 3 warm-up rounds)")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, samples in times.items():
        p90 = sorted(samples)[int(0.9 * (len(samples) - 1))]
        print(f"  {name:<14} median {med[name] * 1000:8.1f} ms   p90 {p90 * 1000:8.1f} ms")
    print(f"  ratio ctproxy chain / bare mitmdump: {med['ctproxy chain'] / med['bare mitmdump']:.2f}")
    print(f"  ratio bare mitmdump / direct:        {med['bare mitmdump'] / med['direct']:.2f}")
    print(f"  ratio ctproxy chain / direct:        {med['ctproxy chain'] / med['direct']:.2f}")
    print(f"  ratio ctproxy chain / chain without compaction+web_search: "
          f"{med['ctproxy chain'] / med['chain w/o 6']:.2f}")
    print("in-process, same body (median of 20):")
    rows = micro(payload)
    base = rows[0][1]
    for name, secs in rows:
        print(f"  {name:<48} {secs * 1000:7.2f} ms   ×{secs / base:5.2f} of one parse")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-chain":
        asyncio.run(serve_chain(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]))
    else:
        parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        parser.add_argument("--requests", type=int, default=30)
        parser.add_argument("--size-mb", type=float, default=1.5)
        asyncio.run(main(parser.parse_args()))
