"""`python -m bench [--quick] [--only NAME ...] [--list]`: run every benchmark in bench/, one process each.

A benchmark is `bench/bench_<name>.py` with a top-level `main()` (sync or async; found by reading the
source, so nothing is imported here). Each runs as a script in its own process, so no two share an
event loop or leftover state. `--quick` is passed on only to modules whose source declares `--quick`.
The exit code is non-zero when any benchmark failed; the others still run.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Benchmark:
    name: str  # "proxy" for bench_proxy.py
    path: Path
    knows_quick: bool


def has_main(source: str) -> bool:
    """True when the module defines a top-level `main` function (def or async def)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == "main"
               for node in tree.body)


def discover(directory: Path = BENCH_DIR) -> list[Benchmark]:
    found = []
    for path in sorted(directory.glob("bench_*.py")):
        source = path.read_text(encoding="utf-8")
        if has_main(source):
            found.append(Benchmark(path.stem.removeprefix("bench_"), path, '"--quick"' in source))
    return found


def command(bench: Benchmark, quick: bool) -> list[str]:
    return [sys.executable, str(bench.path), *(["--quick"] if quick and bench.knows_quick else [])]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs, for modules that support it")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these (e.g. proxy patch)")
    parser.add_argument("--list", action="store_true", help="list the benchmarks found and exit")
    args = parser.parse_args(argv)
    benches = discover()
    if args.only:
        unknown = set(args.only) - {b.name for b in benches}
        if unknown:
            parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}; found: "
                         f"{', '.join(b.name for b in benches)}")
        benches = [b for b in benches if b.name in args.only]
    if args.list:
        for b in benches:
            print(f"{b.name:<12} {b.path.relative_to(BENCH_DIR.parent)}{'  (--quick)' if b.knows_quick else ''}")
        return 0
    failed: list[str] = []
    summary: list[tuple[str, float, int]] = []
    for b in benches:
        cmd = command(b, args.quick)
        shown = ["python", str(b.path.relative_to(BENCH_DIR.parent)), *cmd[2:]]
        print(f"\n=== {b.name}: {' '.join(shown)}", flush=True)
        start = time.monotonic()
        code = subprocess.call(cmd, cwd=BENCH_DIR.parent)
        summary.append((b.name, time.monotonic() - start, code))
        if code != 0:
            failed.append(b.name)
    print("\n=== summary")
    for name, secs, code in summary:
        print(f"  {name:<12} {'ok' if code == 0 else f'FAILED (exit {code})':<18} {secs:6.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
