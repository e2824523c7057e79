"""apply_patch on a 10,000-line file with a 50-hunk patch, against patch(1) with the same diff.

Both sides start from a fresh copy of the file on every run and must produce identical bytes.
Timings are medians over the same number of runs, measured in one process run; what matters
is the ratio, not the absolute figures.

    .venv/bin/python bench/bench_patch.py [--runs 21]
"""

from __future__ import annotations

import argparse
import asyncio
import difflib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from proxy.config import Config
from proxy.state import StateDir
from tools_server.patch import PatchFamily
from tools_server.patch.commit import LocalFs
from tools_server.patch.engine import apply_patch
from tools_server.patch.matcher import apply_chunks
from tools_server.patch.parser import parse_patch
from tools_server.patch.paths import working_dir
from tools_server.registry import CallContext, Services

LINES = 10_000
HUNKS = 50
CONTEXT = 3
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]


def make_source(rng: random.Random) -> list[str]:
    return [f"{i:05d} {' '.join(rng.choices(WORDS, k=6))}" for i in range(LINES)]


def make_edit(old: list[str]) -> tuple[list[str], str]:
    """50 evenly spaced edits (2 lines replaced by 3); returns the new lines and the Codex patch."""
    new = list(old)
    body = ["*** Begin Patch", "*** Update File: big.txt"]
    step = LINES // HUNKS
    for k in reversed(range(HUNKS)):
        at = k * step + step // 2
        new[at:at + 2] = [f"changed {at}", f"changed {at + 1}", f"inserted after {at + 1}"]
    for k in range(HUNKS):
        at = k * step + step // 2
        body.append("@@")
        body += [" " + line for line in old[at - CONTEXT:at]]
        body += ["-" + line for line in old[at:at + 2]]
        body += ["+" + f"changed {at}", "+" + f"changed {at + 1}", "+" + f"inserted after {at + 1}"]
        body += [" " + line for line in old[at + 2:at + 2 + CONTEXT]]
    body.append("*** End Patch")
    return new, "\n".join(body) + "\n"


class NoSyncFs(LocalFs):
    """Commit without fsync, as patch(1) does: shows what durability costs."""

    def write_temp(self, directory: str, name: str, data: bytes, mode: int) -> str:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".ctp-patch")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        return tmp

    def sync_dir(self, path: str) -> None:
        return None


def median_ms(runs: int, setup: Callable[[], None], work: Callable[[], None]) -> float:
    samples = []
    for _ in range(runs):
        setup()
        start = time.perf_counter()
        work()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    if shutil.which("patch") is None:
        sys.exit("patch(1) is not installed; it is the baseline of this benchmark")

    old = make_source(random.Random(4))
    new, codex_patch = make_edit(old)
    source = ("\n".join(old) + "\n").encode()
    expected = ("\n".join(new) + "\n").encode()
    unified = "".join(difflib.unified_diff([line + "\n" for line in old], [line + "\n" for line in new],
                                           "big.txt", "big.txt", n=CONTEXT))

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        ws = root / "ws"
        ws.mkdir()
        target = ws / "big.txt"
        (root / "big.diff").write_text(unified)

        def fresh() -> None:
            target.write_bytes(source)

        def run_patch1() -> None:
            with open(root / "big.diff", "rb") as diff:
                subprocess.run(["patch", "-s", "-p0", "big.txt"], stdin=diff, cwd=ws, check=True)

        cwd = working_dir(ws)

        def run_engine() -> None:
            report = apply_patch(parse_patch(codex_patch), cwd)
            assert report.ok, report.error

        def run_engine_nosync() -> None:
            report = apply_patch(parse_patch(codex_patch), cwd, fs=NoSyncFs())
            assert report.ok, report.error

        services = Services(config=Config.model_validate({"apply_patch": {"enabled": True}}),
                            state=StateDir.open(root / "state"), workspace=ws)
        tool = PatchFamily(services).tool

        def run_tool() -> None:
            result = asyncio.run(tool.call({"patch": codex_patch}, CallContext(services=services)))
            assert not result.is_error, result.text

        def run_in_memory() -> None:
            (hunk,) = parse_patch(codex_patch).hunks
            apply_chunks(old, hunk.chunks, "big.txt")  # type: ignore[union-attr]

        # Correctness first: every contender must write exactly the expected bytes.
        for work in (run_patch1, run_engine, run_engine_nosync, run_tool):
            fresh()
            work()
            assert target.read_bytes() == expected, work.__name__

        baseline = median_ms(args.runs, fresh, run_patch1)
        rows = [
            ("patch(1) -s -p0 (subprocess, unified diff)", baseline),
            ("apply_patch engine (parse+preflight+stage+commit)", median_ms(args.runs, fresh, run_engine)),
            ("apply_patch engine without fsync (as patch(1))", median_ms(args.runs, fresh, run_engine_nosync)),
            ("apply_patch tool call (args validation, queue, thread)", median_ms(args.runs, fresh, run_tool)),
            ("apply_patch parse+match only, in memory", median_ms(args.runs, lambda: None, run_in_memory)),
        ]

    print(f"{LINES} lines, {HUNKS} hunks, {CONTEXT} context lines, median of {args.runs} runs each")
    for name, ms in rows:
        print(f"  {name:<56} {ms:8.2f} ms   x{ms / baseline:5.2f} of patch(1)")


if __name__ == "__main__":
    main()
