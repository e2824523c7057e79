"""The shell sandbox's cost: `exec_command true` through REST, sandboxed against unsandboxed, in one run.

    .venv/bin/python bench/bench_sandbox.py [--calls 200] [--quick]

Three tool servers in this process, on loopback ports: `shell.sandbox` workspace-write (bubblewrap + prlimit),
danger-full-access with the same per-job limits (prlimit, and a pids cgroup where one is writable), and
danger-full-access without limits. Calls are
interleaved (`round_robin`), and the added milliseconds are the paired median difference with its 95 % interval.
The target is at most 10 ms added by the sandbox (issues 33, 45); the ratio sandboxed / unsandboxed is printed too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aiohttp

from bench.common import paired_difference, print_table, ratio, round_robin, summarize, write_result
from proxy.sandbox.bwrap import sandbox_problem
from tests.support.toolserver import ToolServerHandle, make_services

TARGETS = {
    "sandboxed": {"shell.sandbox": "workspace-write"},
    "unsandboxed+limits": {"shell.sandbox": "danger-full-access"},
    "unsandboxed": {"shell.sandbox": "danger-full-access", "shell.cpu_limit_s": 0, "shell.memory_limit_mb": 0,
                    "shell.max_processes": 0},
}


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    calls = 30 if args.quick else args.calls
    if (problem := sandbox_problem("workspace-write")) is not None:
        print(f"sandbox: skipped, {problem}")
        return
    root = Path(tempfile.mkdtemp(prefix="ctp-bench-sandbox-"))
    handles: dict[str, ToolServerHandle] = {}
    try:
        for name, overrides in TARGETS.items():
            services = make_services(root / name, {"shell.enabled": True, **overrides})
            handles[name] = ToolServerHandle(services, services.state.token())
            await handles[name].start()
        body = json.dumps({"cmd": "true"})
        async with aiohttp.ClientSession() as http:

            async def one(name: str, h: ToolServerHandle) -> float:
                t0 = time.perf_counter()
                async with http.post(f"{h.url}/v1/tools/exec_command", data=body,
                                     headers=h.headers("bench", "/root")) as resp:
                    out: dict[str, Any] = await resp.json()
                took = time.perf_counter() - t0
                assert resp.status == 200 and out.get("details", {}).get("exit_code") == 0, out
                return took

            await round_robin(handles, 5, one)  # warm-up
            samples = await round_robin(handles, calls, one)
    finally:
        for h in handles.values():
            await h.close()
    rows = []
    for name, values in samples.items():
        st = summarize(values).ms()
        rows.append([name, st["n"], st["median"], st["p99"]])
    print("exec_command true through REST (ms)")
    print_table(["target", "n", "median", "p99"], rows)
    added = paired_difference(samples["sandboxed"], samples["unsandboxed+limits"])
    limits = paired_difference(samples["unsandboxed+limits"], samples["unsandboxed"])
    whole = paired_difference(samples["sandboxed"], samples["unsandboxed"])
    print(f"added by bubblewrap: {added.median * 1000:.2f} ms (95% {added.low * 1000:.2f}..{added.high * 1000:.2f})")
    print(f"added by the limits: {limits.median * 1000:.2f} ms (95% {limits.low * 1000:.2f}..{limits.high * 1000:.2f})")
    print(f"sandbox + limits:    {whole.median * 1000:.2f} ms (95% {whole.low * 1000:.2f}..{whole.high * 1000:.2f}); "
          f"target <= 10 ms: {'met' if whole.median <= 0.010 else 'NOT met'}")
    sandboxed, bare = summarize(samples["sandboxed"]).median, summarize(samples["unsandboxed"]).median
    times = ratio(sandboxed, bare)
    print(f"sandboxed / unsandboxed: {times:.2f}x ({sandboxed * 1000:.2f} ms against {bare * 1000:.2f} ms, "
          f"+{(sandboxed - bare) * 1000:.2f} ms by the medians)")
    path = write_result("sandbox", {
        "calls": calls, "ms": {name: summarize(v).ms() for name, v in samples.items()},
        "added_ms": {"bwrap": added.median * 1000, "limits": limits.median * 1000, "both": whole.median * 1000},
        "ratio": times})
    print(f"written to {path}")


if __name__ == "__main__":
    asyncio.run(main())
