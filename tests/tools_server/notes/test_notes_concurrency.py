"""8 processes appending concurrently: every append exactly once, the byte cap exact, no temp file listed."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from pathlib import Path

from proxy.notes import NoteError, NotesStore

PROCS = 8
APPENDS = 500
TASK = "task_concurrency"


def _appender(root: str, proc: int, start: multiprocessing.synchronize.Event) -> None:
    store = NotesStore(Path(root), TASK, lock_timeout=120)
    start.wait(60)
    for n in range(APPENDS):
        store.append("/root", "shared.md", f"p{proc}-{n}\n")
        store.append("/root", f"own/{proc}.md", f"{n}\n")


def _capped(root: str, proc: int, start: multiprocessing.synchronize.Event, out: multiprocessing.Queue) -> None:
    store = NotesStore(Path(root), TASK, max_bytes=10_000, lock_timeout=120)
    start.wait(60)
    accepted = []
    for n in range(40):
        chunk = f"{proc:02d}:{n:03d}:".ljust(99, "x") + "\n"  # 100 bytes
        try:
            store.append("/root", "capped.md", chunk)
            accepted.append(chunk)
        except NoteError:
            pass
    out.put(accepted)


def _run(target, args_for) -> list[multiprocessing.Process]:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=args_for(i)) for i in range(PROCS)]
    for p in procs:
        p.start()
    return procs


def test_eight_processes_append_exactly_once_and_no_temp_file_is_listed(tmp_path: Path):
    root = tmp_path / "notes"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = _run(_appender, lambda i: (str(root), i, start))
    store = NotesStore(root, TASK)
    allowed = {"shared.md"} | {f"own/{i}.md" for i in range(PROCS)}
    seen: set[str] = set()
    stop = threading.Event()

    def lister() -> None:  # lists the whole time the writers run
        while not stop.is_set():
            for info in store.iter_files("/root"):
                seen.add(info.rel)
            stop.wait(0.002)

    t = threading.Thread(target=lister)
    t.start()
    start.set()
    for p in procs:
        p.join(600)
        assert p.exitcode == 0
    stop.set()
    t.join()
    assert seen <= allowed and "shared.md" in seen
    lines = store.read("/root", "shared.md").splitlines()
    assert len(lines) == PROCS * APPENDS
    counts = Counter(lines)
    assert set(counts.values()) == {1}
    assert set(counts) == {f"p{i}-{n}" for i in range(PROCS) for n in range(APPENDS)}
    for i in range(PROCS):
        assert store.read("/root", f"own/{i}.md") == "".join(f"{n}\n" for n in range(APPENDS))
        # Each process's own appends to the shared note keep their order.
        mine = [ln for ln in lines if ln.startswith(f"p{i}-")]
        assert mine == [f"p{i}-{n}" for n in range(APPENDS)]
    assert sorted(n.rel for n in store.iter_files("/root")) == sorted(allowed)


def test_byte_cap_is_exact_under_contention(tmp_path: Path):
    root = tmp_path / "notes"
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    out = ctx.Queue()
    procs = _run(_capped, lambda i: (str(root), i, start, out))
    start.set()
    accepted = [chunk for _ in procs for chunk in out.get(timeout=600)]
    for p in procs:
        p.join(600)
        assert p.exitcode == 0
    content = NotesStore(root, TASK).read("/root", "capped.md")
    assert len(content.encode()) == 10_000 and len(accepted) == 100
    assert Counter(content.splitlines(keepends=True)) == Counter(accepted)
