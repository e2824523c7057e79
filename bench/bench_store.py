"""The journal on PostgreSQL against the embedded store (issue 32, ADR 0013), measured in one run.

Both stores are served through the one store interface (`Store.journal()`): the embedded store is SQLite in a
temporary state directory, PostgreSQL a private server started here (tests/support/postgres.py: Debian's
`postgresql`, run as the `postgres` user, 127.0.0.1, fsync off).

1. Journal append: one turn's batch (the request's new user item, the answer's item, the branch append, the
   response and its alias), applied as the writer applies it: one transaction (`JournalBackend.apply`). The
   embedded store as it runs by default (no session stamps); PostgreSQL as it always runs (stamped, the
   session's advisory lock).
2. History search over `--items` (100,000) journaled items of one agent: `history().search` (the history tools'
   reader: candidates from FTS5 trigram / pg_trgm, each verified against the text), newest first, limit 50, for a
   rare literal (10 items), a frequent one (stops at the limit), an absent one and two 2-character ones (a frequent
   and a rare one: pg_trgm has no trigram to look up for either).

    .venv/bin/python bench/bench_store.py [--items 100000] [--turns 300] [--runs 20]

Prints medians and PostgreSQL/embedded ratios; the issue asks for search over 100,000 items under 50 ms on
PostgreSQL.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from proxy.journal.ops import (  # noqa: E402
    EnsureAgent,
    EnsureSession,
    EnsureTask,
    Op,
    PutAlias,
    PutItem,
    PutResponse,
    PutWindow,
    SetBranch,
)
from proxy.journal.query import ItemFilter  # noqa: E402
from proxy.state import StateDir  # noqa: E402
from proxy.store.embedded import EmbeddedStore  # noqa: E402
from proxy.store.interface import Store  # noqa: E402

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "lambda", "sigma", "omega", "river",
         "stone", "cloud", "paper", "window", "engine", "socket", "buffer", "thread", "commit", "branch", "merge",
         "render", "parse", "token"]


def _item(role: str, text: str, n: int) -> bytes:
    if role == "assistant":
        return orjson.dumps({"type": "message", "id": f"msg_{n}", "role": "assistant", "status": "completed",
                             "content": [{"type": "output_text", "text": text, "annotations": []}]})
    return orjson.dumps({"role": "user", "content": text})


def _register(session: str, task: str) -> list[Op]:
    return [EnsureTask(task, "session", 1.0), EnsureAgent(task, "/root", 1.0),
            EnsureSession(session, task, "/root", "bench", 1.0),
            PutWindow(task, "/root", "w1", 1, session, None, "start", {}, 1.0)]


def _turn(session: str, n: int, pos: int, texts: tuple[str, str]) -> list[Op]:
    """One turn's ops: its new user item, the answer's item, the branch append, the response and its alias."""
    q, a = f"{session}:q{n}", f"{session}:a{n}"
    now = time.time()
    return [PutItem(q, session, f"{session}:a{n - 1}" if n else None, "w1", "input", _item("user", texts[0], n),
                    "c" + q, None, now),
            PutItem(a, session, q, "w1", "output", _item("assistant", texts[1], n), "c" + a, f"resp_{session}_{n}",
                    now),
            SetBranch(session, pos, (q, a)),
            PutResponse(f"resp_{session}_{n}", session, "gpt-5", "completed", {"input_tokens": 10}, None, a, 1,
                        False, now),
            PutAlias(f"resp_{session}_{n}", session, now)]


def _text(rng: random.Random, n: int) -> str:
    words = rng.choices(WORDS, k=12)
    if n % 10_000 == 7:
        words.insert(5, "needle-Xq9")  # rare: one item in ten thousand
    return " ".join(words) + f" #{n}"


def fill(store: Store, items: int, stamp: str | None) -> str:
    """`items` items (half user, half answers) in one session of one agent; the task id."""
    backend = store.journal()
    task, session = "t_search", "s:search"
    backend.apply(_register(session, task), stamp)
    rng = random.Random(7)
    batch: list[Op] = []
    for n in range(items // 2):
        batch += _turn(session, n, 2 * n, (_text(rng, 2 * n), _text(rng, 2 * n + 1)))
        if len(batch) >= 1000:
            backend.apply(batch, stamp)
            batch = []
    if batch:
        backend.apply(batch, stamp)
    if backend.indexes_text:
        while backend.index_text():
            pass
    return task


def time_appends(store: Store, turns: int, stamp: str | None) -> list[float]:
    backend = store.journal()
    backend.apply(_register("s:append", "t_append"), stamp)
    out = []
    for n in range(turns):
        ops = _turn("s:append", n, 2 * n, (f"question {n} about the river", f"answer {n}: the stone"))
        t0 = time.perf_counter()
        backend.apply(ops, stamp)
        out.append(time.perf_counter() - t0)
    return out


def time_search(store: Store, task: str, query: str, runs: int) -> tuple[float, int]:
    reader = store.journal().history()
    samples, found = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        hits, _more = reader.search(task, "/root", query, ItemFilter(), 50, True)
        samples.append(time.perf_counter() - t0)
        found = len(hits)
    return statistics.median(samples), found


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=100_000)
    ap.add_argument("--turns", type=int, default=300)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()

    from tests.support.postgres import private_server, unavailable

    why = unavailable()
    if why is not None:
        sys.exit(f"bench_store: PostgreSQL cannot be had here: {why}")
    from proxy.store.pg import PostgresStore

    server_gen = private_server()
    server = next(server_gen)
    tmp = Path(tempfile.mkdtemp(prefix="bench_store_"))
    stores: dict[str, Store] = {}
    try:
        stores["embedded"] = EmbeddedStore(StateDir.open(tmp / "state"))
        stores["postgresql"] = PostgresStore.open(server.fresh_database("bench"), max_size=4)
        stamps = {"embedded": None, "postgresql": "bench"}

        appends = {}
        for name, store in stores.items():
            time_appends(store, 20, stamps[name])  # warm-up (another session)
        for name, store in stores.items():
            # (a fresh session per store for the measured turns)
            backend = store.journal()
            backend.apply(_register("s:measured", "t_append"), stamps[name])
            samples = []
            for n in range(args.turns):
                ops = _turn("s:measured", n, 2 * n, (f"question {n} about the river", f"answer {n}: the stone"))
                t0 = time.perf_counter()
                backend.apply(ops, stamps[name])
                samples.append(time.perf_counter() - t0)
            appends[name] = statistics.median(samples)

        fills, tasks = {}, {}
        for name, store in stores.items():
            t0 = time.perf_counter()
            tasks[name] = fill(store, args.items, stamps[name])
            fills[name] = time.perf_counter() - t0
        with stores["postgresql"].pool.connection() as conn:  # type: ignore[attr-defined]
            conn.execute("ANALYZE")

        print(f"journal append, one turn's batch (5 ops, 2 items), median of {args.turns}:")
        e, p = appends["embedded"], appends["postgresql"]
        print(f"  embedded {e * 1e3:.3f} ms   postgresql {p * 1e3:.3f} ms   ratio pg/embedded {p / e:.2f}")
        print(f"filling {args.items} items: embedded {fills['embedded']:.1f} s, postgresql {fills['postgresql']:.1f} s")
        print(f"history search over {args.items} items (one agent), newest first, limit 50, median of {args.runs}:")
        for label, query in (("rare", "needle-Xq9"), ("frequent", "river stone"), ("absent", "no-such-words"),
                             ("short", "ta"), ("short rare", "Xq")):
            res = {name: time_search(store, tasks[name], query, args.runs) for name, store in stores.items()}
            (e, ne), (p, np_) = res["embedded"], res["postgresql"]
            assert ne == np_, (label, ne, np_)
            print(f"  {label:10s} {query!r:16s} hits {ne:3d}   embedded {e * 1e3:7.2f} ms   postgresql "
                  f"{p * 1e3:7.2f} ms   ratio pg/embedded {p / e:6.2f}   {'<' if p < 0.05 else '>='} 50 ms")
    finally:
        for store in stores.values():
            store.close()
        server_gen.close()


if __name__ == "__main__":
    main()
