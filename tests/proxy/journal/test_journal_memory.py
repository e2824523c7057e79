"""Memory per request stays bounded (issue 32, point 4): a big session's cached branch and last input are let
go once it is idle, so a process that served huge sessions comes back to what it held before them. Measured
with tracemalloc (Python objects alive), which does not depend on the allocator or the machine's load."""

from __future__ import annotations

import gc
import sqlite3
import time
import tracemalloc
from pathlib import Path

from proxy.journal import Journal
from proxy.state import StateDir

ITEMS = 12_000


def _msg(role: str, text: str) -> dict:
    return {"role": role, "content": text}


def _turn(j: Journal, key: str, task: str, inp: list[dict], n: int) -> None:
    st = j.session(key, task, "/root", "fingerprint")
    mark = j.ingest_request(st, {"input": inp})
    j.ingest_response(mark, [{"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": f"answer {n}"}]}], response_id=f"resp_{key}_{n}", model="gpt-5",
        status="completed", usage=None, error=None, incomplete=False)


def _traced() -> int:
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def test_big_idle_sessions_leave_nothing_behind(tmp_path: Path):
    j = Journal(StateDir.open(tmp_path / "state"), big_entries=5_000, release_after=3600)
    tracemalloc.start()
    try:
        task = j.create_task()
        _turn(j, "f:warm", task, [_msg("user", "warm up")], 0)  # caches, statements, the writer's first batch
        assert j.flush()
        before = _traced()
        for s in range(2):  # two distinct big sessions, one after the other
            inp = [_msg("user" if i % 2 == 0 else "assistant", f"s{s} item {i}") for i in range(ITEMS)]
            _turn(j, f"f:big{s}", task, inp, 1)
            del inp
        assert j.flush()
        held = _traced() - before
        assert j.released == 0 and held > 2 << 20, held  # cached while they may be continued (≈75 bytes an item)
        j.release_after = 0.2  # (tracemalloc slows the turns down: the idle time is shortened only now)
        time.sleep(0.3)
        j._release_timer.cancel()  # the one pending look, an hour away
        j._release_timer = None
        j._schedule_release(0)
        deadline = time.monotonic() + 30
        while j.released < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert j.released == 2
        after = _traced() - before
        assert after < 1 << 20, f"{after / 2**20:.1f} MB still held of {held / 2**20:.1f} MB"
        # A released session goes on where it was: read back from the database by its next request.
        inp = [_msg("user" if i % 2 == 0 else "assistant", f"s0 item {i}") for i in range(ITEMS)]
        inp += [{"role": "assistant", "content": [{"type": "output_text", "text": "answer 1"}]},
                _msg("user", "one more")]
        _turn(j, "f:big0", task, inp, 2)
        assert j.flush()
    finally:
        tracemalloc.stop()
        j.close()
    conn = sqlite3.connect(tmp_path / "state" / "ctproxy.db")
    n = conn.execute("SELECT count(*) FROM journal_branch WHERE session_key='f:big0'").fetchone()[0]
    assert n == ITEMS + 3  # every item once, the continuation appended
    assert conn.execute("SELECT count(*) FROM journal_branch_heads").fetchone()[0] == 0


def test_a_small_or_busy_session_stays_cached(tmp_path: Path):
    j = Journal(StateDir.open(tmp_path / "state"), big_entries=5_000, release_after=0.5)
    try:
        task = j.create_task()
        _turn(j, "f:small", task, [_msg("user", "hi")], 0)
        inp = [_msg("user" if i % 2 == 0 else "assistant", f"item {i}") for i in range(6_000)]
        for n in range(6):  # used every 0.2 s: never idle long enough
            _turn(j, "f:busy", task, inp, n)
            time.sleep(0.2)
        assert j.flush()
        assert j.released == 0
        assert {"f:small", "f:busy"} <= set(j._sessions)
    finally:
        j.close()


def test_a_big_request_in_flight_costs_about_what_its_items_do(tmp_path: Path):
    """The journal holds each new item's JSON until the writer commits it. orjson's own bytes keep its writer's
    buffer (4 KiB for an item of 40 bytes), so 12,000 held items took 48 MB in flight; right-sized
    (proxy/items/jsonbytes.py) the whole turn's work peaks at a few hundred bytes an item."""
    j = Journal(StateDir.open(tmp_path / "state"), big_entries=5_000, release_after=3600)
    tracemalloc.start()
    try:
        task = j.create_task()
        _turn(j, "f:warm", task, [_msg("user", "warm up")], 0)
        assert j.flush()
        inp = [_msg("user" if i % 2 == 0 else "assistant", f"item {i}") for i in range(ITEMS)]
        gc.collect()
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        _turn(j, "f:big", task, inp, 1)
        assert j.flush()
        peak = tracemalloc.get_traced_memory()[1] - before
        assert peak < 1500 * ITEMS, f"{peak / ITEMS:.0f} bytes an item at the peak"
    finally:
        tracemalloc.stop()
        j.close()
