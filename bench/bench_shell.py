"""Shell sessions: REST round trip of a trivial command, and capture throughput, against baselines.

    .venv/bin/python bench/bench_shell.py [--calls 200] [--mb 200] [--quick]

1. Round trip: `POST /v1/tools/exec_command {"cmd": "true"}` against the tool server app started
   in-process with aiohttp's runner on a loopback port (keep-alive client). Baselines measured in
   the same run: `GET /healthz` on the same server (HTTP + auth, no process), and a bare asyncio
   spawn-and-wait of `<shell> -c true` (the process cost alone). Median and p99 per path, and ratios.
2. Capture: `exec_command {"cmd": "yes | head -c <mb>M"}` through the family (decode, preview,
   capture file on disk), polled until it exits; the capture file is checked to hold every byte.
   Baselines in the same run: `yes | head -c <mb>M | cat > /dev/null` (an ordinary consumer) and an
   asyncio pipe reader that discards (Python's own pipe cost). Throughput in MB/s and ratios.
Absolute figures depend on the machine; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp
from aiohttp import web

from proxy.config import Config
from proxy.state import StateDir
from tools_server.registry import CallContext, Services
from tools_server.shell import create_family


def _services(root: Path) -> Services:
    config = Config()
    config.shell.enabled = True
    workspace = root / "ws"
    workspace.mkdir(parents=True, exist_ok=True)
    return Services(config=config, state=StateDir.open(root / "state"), workspace=workspace)


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


async def bench_round_trip(root: Path, calls: int) -> None:
    try:
        from tools_server.app import bind_port, create_app
    except ImportError as exc:
        print(f"round trip: skipped, the tool server app is not available ({exc})")
        return
    services = _services(root / "rt")
    token = services.state.token()
    app = create_app(services, token=token, listen_host="127.0.0.1", port=None)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    bind_port(app, port)
    url = f"http://127.0.0.1:{port}"
    headers = {"Authorization": f"Bearer {token}", "x-ctp-task": "bench", "x-ctp-agent": "/root"}
    body = json.dumps({"cmd": "true"})
    shell = os.environ.get("SHELL") or "/bin/sh"
    exec_t: list[float] = []
    health_t: list[float] = []
    spawn_t: list[float] = []
    try:
        async with aiohttp.ClientSession() as http:
            for i in range(calls + 10):  # interleaved, so drift hits every path alike
                t0 = time.perf_counter()
                async with http.post(f"{url}/v1/tools/exec_command", data=body, headers=headers) as resp:
                    payload = await resp.json()
                t1 = time.perf_counter()
                assert payload["ok"] and payload["details"]["exit_code"] == 0, payload
                async with http.get(f"{url}/healthz", headers=headers) as resp:
                    await resp.read()
                t2 = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(shell, "-c", "true", start_new_session=True)
                await proc.wait()
                t3 = time.perf_counter()
                if i >= 10:  # warm-up
                    exec_t.append(t1 - t0)
                    health_t.append(t2 - t1)
                    spawn_t.append(t3 - t2)
    finally:
        await runner.cleanup()
    e_med, e_p99 = _stats(exec_t)
    h_med, h_p99 = _stats(health_t)
    s_med, s_p99 = _stats(spawn_t)
    print(f"round trip over {calls} calls (ms)        median      p99")
    print(f"  REST exec_command {{cmd: true}}     {e_med * 1e3:8.2f} {e_p99 * 1e3:8.2f}")
    print(f"  REST GET /healthz (baseline)       {h_med * 1e3:8.2f} {h_p99 * 1e3:8.2f}")
    print(f"  bare spawn+wait {shell} -c true   {s_med * 1e3:8.2f} {s_p99 * 1e3:8.2f}")
    print(f"  ratio exec / (healthz + bare spawn): median {e_med / (h_med + s_med):.2f}, "
          f"p99 {e_p99 / (h_p99 + s_p99):.2f}")


async def _asyncio_discard(cmd: str) -> int:
    proc = await asyncio.create_subprocess_exec("/bin/sh", "-c", cmd, stdout=subprocess.PIPE,
                                                limit=1 << 20)
    assert proc.stdout is not None
    total = 0
    while chunk := await proc.stdout.read(1 << 18):
        total += len(chunk)
    await proc.wait()
    return total


async def bench_capture(root: Path, mb: int) -> None:
    size = mb * 1024 * 1024
    producer = f"yes | head -c {mb}M"

    t0 = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", f"{producer} | cat > /dev/null"], check=True)
    cat_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    got = await _asyncio_discard(producer)
    reader_s = time.perf_counter() - t0
    assert got == size, got

    services = _services(root / "cap")
    family = create_family(services)
    exec_tool, write_tool = family.tools()
    ctx = CallContext(services=services, task="bench", agent="/root")
    try:
        t0 = time.perf_counter()
        res = await exec_tool.call({"cmd": producer, "yield_time_ms": 30_000}, ctx)
        while not res.is_error and "exit_code" not in res.details:
            res = await write_tool.call({"session_id": res.details["session_id"],
                                         "yield_time_ms": 30_000}, ctx)
        shell_s = time.perf_counter() - t0
        assert not res.is_error, res.text
        rec = res.details["recovery"]["stdout"]
        assert rec["state"] == "complete" and rec["capturedBytes"] == size, rec
        assert Path(rec["path"]).stat().st_size == size
    finally:
        await family.close()

    def rate(seconds: float) -> float:
        return size / 1e6 / seconds

    print(f"capture of `{producer}` ({size / 1e6:.0f} MB)       MB/s")
    print(f"  exec_command (preview + capture file)   {rate(shell_s):8.1f}")
    print(f"  | cat > /dev/null (baseline)             {rate(cat_s):8.1f}")
    print(f"  asyncio pipe read, discard               {rate(reader_s):8.1f}")
    print(f"  ratio exec_command / cat: {rate(shell_s) / rate(cat_s):.2f}; "
          f"exec_command / asyncio reader: {rate(shell_s) / rate(reader_s):.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--mb", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="50 calls and 50 MB")
    args = parser.parse_args()
    if args.quick:
        args.calls, args.mb = min(args.calls, 50), min(args.mb, 50)
    root = Path(tempfile.mkdtemp(prefix="bench-shell-"))
    try:
        await bench_round_trip(root, args.calls)
        await bench_capture(root, args.mb)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
