"""Shared helpers for `bench/bench_*.py`: the processes a benchmark measures, and latency statistics.

Processes (each in its own OS process, so client, upstream and proxy never share an event loop):

    with Processes() as procs:
        emu = procs.emulator(stream_deltas=192)     # tests/emulator in a process; emu.url, emu.port
        bare = procs.mitmdump(emu.url)               # bare `mitmdump -q --mode reverse:…@PORT`, no addons
        ct = procs.ctproxy(emu.url)                  # `ctproxy up --upstream … --trust-upstream`
        ...                                          # everything is stopped (SIGTERM) on exit

Statistics: `summarize(samples)` → `Stats` (n, median, p99, mean, min, max; seconds), `ratio(a, b)`,
`paired_difference(a, b)` → `Paired` (median of per-round differences, 95 % interval, verdict).
Order: `await round_robin(targets, rounds, fn)` interleaves targets per round, in a new seeded order each round.
Output: `print_table(headers, rows)`, `write_result(name, data)` → `bench/results/<name>.json`, and the
run appended to `<name>.history.jsonl`.

Profiling: with `CTP_BENCH_PROFILE=DIR` in the environment, every `ctproxy up` started here runs under
cProfile and writes `DIR/ctproxy-<port>.prof` when it stops (read it with `python -m pstats`).

Convention for benchmark modules: `bench/bench_<name>.py` defines `main()` and runs as a script;
`python -m bench` runs each one in its own process and passes `--quick` to those whose source
declares a `--quick` option.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PROFILE_ENV = "CTP_BENCH_PROFILE"
START_TIMEOUT = 60.0

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mitmdump_path() -> str:
    """The venv's mitmdump next to this interpreter, else the one on PATH."""
    return shutil.which("mitmdump", path=str(Path(sys.executable).parent)) or shutil.which("mitmdump") or "mitmdump"


@dataclass
class Service:
    """A started process listening on `port`; `url` is its origin (no path)."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Processes:
    """Starts the emulator, bare mitmdump and ctproxy as processes; stops them all on exit."""

    def __init__(self, workdir: Path | None = None):
        self._tmp = None if workdir else tempfile.TemporaryDirectory(prefix="ctproxy-bench-")
        self.workdir = workdir or Path(self._tmp.name)  # type: ignore[union-attr]
        self.services: list[Service] = []
        self.env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}

    def __enter__(self) -> Processes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def stop_all(self) -> None:
        for svc in reversed(self.services):
            svc.stop()
        self.services.clear()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _spawn(self, name: str, port: int, cmd: list[str], ready: Callable[[Service], bool],
               tree: Path | None = None, start_timeout: float = START_TIMEOUT) -> Service:
        log_path = self.workdir / f"{name}-{port}.log"
        env = self.env if tree is None else {**self.env, "PYTHONPATH": str(tree)}
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, cwd=tree or REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        svc = Service(name, port, proc, log_path)
        self.services.append(svc)
        deadline = time.monotonic() + start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited early with code {proc.returncode}:\n{svc.log()[-2000:]}")
            if ready(svc):
                return svc
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not become ready within {start_timeout:.0f} s:\n{svc.log()[-2000:]}")

    def emulator(self, stream_deltas: int = 3, json_deltas: int = 3, max_recorded: int = 4) -> Service:
        """The Responses emulator (tests/emulator) in its own process, answering every `POST /v1/responses`
        with its echo reply: `stream_deltas` text deltas when the request streams, `json_deltas` otherwise
        (a non-streaming answer need not pay for rendering hundreds of events it never sends).
        It keeps few recorded requests so big bodies do not pile up in memory."""
        port = free_port()
        cmd = [sys.executable, "-m", "tests.emulator", "--port", str(port), "--deltas", str(stream_deltas),
               "--json-deltas", str(json_deltas), "--max-recorded", str(max_recorded)]
        return self._spawn("emulator", port, cmd, lambda s: "listening on" in s.log())

    def mitmdump(self, upstream: str, scripts: Sequence[str | Path] = (), options: Mapping[str, str] = (),
                 quiet: bool = True, wrap: Sequence[str] = (), start_timeout: float = START_TIMEOUT) -> Service:
        """mitmdump in reverse mode to `upstream`; with no `scripts` it is the bare baseline. `wrap`: a command
        the process runs under (e.g. valgrind's, bench/bench_instructions.py)."""
        port = free_port()
        cmd = [*wrap, mitmdump_path(), *(["-q"] if quiet else []), "--mode", f"reverse:{upstream}@{port}",
               "--set", "listen_host=127.0.0.1", "--set", f"confdir={self.workdir / f'mitm-{port}'}"]
        for script in scripts:
            cmd += ["-s", str(script)]
        for key, value in dict(options).items():
            cmd += ["--set", f"{key}={value}"]
        return self._spawn("mitmdump", port, cmd, lambda s: _port_open(s.port), start_timeout=start_timeout)

    def ctproxy(self, upstream: str, extra_args: Sequence[str] = (), trust_upstream: bool = True,
                with_tools: bool = True, tree: Path | None = None, wrap: Sequence[str] = (),
                start_timeout: float = START_TIMEOUT) -> Service:
        """`ctproxy up --upstream URL [--trust-upstream]` with its own state dir and free ports; `tree`: run
        another checkout's code (a `git worktree` of an earlier commit), for before/after in one run.

        Under `CTP_BENCH_PROFILE=DIR` it runs inside cProfile (main thread: mitmproxy's event loop)."""
        port, tools_port = free_port(), free_port()
        state = self.workdir / f"state-{port}"
        args = ["up", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}",
                "--tools-listen", f"127.0.0.1:{tools_port}", "--upstream", upstream]
        if trust_upstream:
            args.append("--trust-upstream")
        if not with_tools:
            args.append("--no-tools")
        args += list(extra_args)
        prefix = [*wrap, sys.executable]
        if profile_dir := os.environ.get(PROFILE_ENV):
            Path(profile_dir).mkdir(parents=True, exist_ok=True)
            prefix += ["-m", "cProfile", "-o", str(Path(profile_dir) / f"ctproxy-{port}.prof")]
        # A checkout from before the floor plan (ADR 0014) has its command line at proxy/cli.py.
        root = tree if tree is not None else Path(__file__).resolve().parents[1]
        module = "proxy.app.cli" if (root / "proxy" / "app" / "cli.py").is_file() else "proxy.cli"
        cmd = [*prefix, "-m", module, *args]
        return self._spawn("ctproxy", port, cmd, lambda s: "ctproxy ready" in s.log(), tree, start_timeout)


# ---- statistics ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """Latency summary in seconds; p99 is the nearest-rank 99th percentile."""

    n: int
    median: float
    p99: float
    mean: float
    min: float
    max: float

    def ms(self) -> dict[str, float | int]:
        return {k: (v if k == "n" else round(v * 1000, 3)) for k, v in asdict(self).items()}


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile, q in [0, 100]."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(samples: Sequence[float]) -> Stats:
    if not samples:
        return Stats(0, math.nan, math.nan, math.nan, math.nan, math.nan)
    return Stats(len(samples), statistics.median(samples), percentile(samples, 99), statistics.fmean(samples),
                 min(samples), max(samples))


@dataclass
class Paired:
    """The median of per-round differences a − b (targets interleaved, so round i of each met the same machine),
    with a distribution-free 95 % confidence interval: the order statistics the sign test puts around the
    median (binomial, normal approximation). Drift between rounds cancels in a difference; what is left is
    what a target adds."""

    n: int
    median: float
    low: float
    high: float

    @property
    def verdict(self) -> str:
        """'slower' / 'faster' when the interval excludes zero, else 'level'."""
        return "slower" if self.low > 0 else "faster" if self.high < 0 else "level"


def paired_difference(a: Sequence[float], b: Sequence[float]) -> Paired:
    diffs = sorted(x - y for x, y in zip(a, b, strict=True))
    n = len(diffs)
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan)
    k = max(0, math.floor((n - 1.96 * math.sqrt(n)) / 2) - 1)  # 0-based rank of the lower bound
    return Paired(n, statistics.median(diffs), diffs[k], diffs[n - 1 - k])


def ratio(a: float, b: float) -> float:
    return a / b if b else math.nan


ROUND_SEED = 20261202  # the order of targets in each round of `round_robin`


async def round_robin[K, V, T](
    targets: Mapping[K, V], rounds: int, fn: Callable[[K, V], Awaitable[T]]
) -> dict[K, list[T]]:
    """Run `fn(key, target)` for every target in each round, one at a time, in a new order each round (seeded,
    so runs repeat), so slow drift of a shared machine hits every target equally, and so does the one before
    it: a target's work after its answer (a log line, a journal commit) overlaps the next target's request.
    (Rotating a fixed order, as this did before, put each target after the same neighbour every round; the
    one after bare mitmdump paid ≈0.2–0.5 ms of it on a 10 KB request.)"""
    keys = list(targets)
    out: dict[K, list[T]] = {k: [] for k in keys}
    order = random.Random(ROUND_SEED)
    for _ in range(rounds):
        this_round = keys[:]
        order.shuffle(this_round)
        for key in this_round:
            out[key].append(await fn(key, targets[key]))
    return out


# ---- output -------------------------------------------------------------------------------------


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            print("  ".join("-" * w for w in widths))


def write_result(name: str, data: Mapping[str, Any]) -> Path:
    """Write `bench/results/<name>.json` (git-ignored; the latest run) and return its path.

    Every run is also appended as one line to `<name>.history.jsonl`, stamped with the time and the commit, so
    a later run does not erase the figures of an earlier one.
    """
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)  # a run interrupted while writing leaves the previous result whole
    stamp = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": _commit()}
    with (RESULTS / f"{name}.history.jsonl").open("a") as history:
        history.write(json.dumps({**stamp, "result": data}, sort_keys=False) + "\n")
    return path


def _commit() -> str | None:
    """The checkout's commit (with `+dirty` when it has uncommitted changes), or None outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")
