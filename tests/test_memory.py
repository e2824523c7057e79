"""proxy/memory.py: a big body schedules one trim of the C heap, off the event loop."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from proxy import memory


@pytest.mark.skipif(not memory.available(), reason="the C library has no malloc_trim (not glibc)")
def test_a_big_body_schedules_one_trim():
    before = memory.trims
    memory.note_big_work(10, delay=0.01)  # small: nothing to give back
    memory.note_big_work(memory.BIG_BYTES, delay=0.05)
    memory.note_big_work(memory.BIG_BYTES, delay=0.05)  # one pending at a time
    deadline = time.monotonic() + 30
    while memory.trims == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert memory.trims == before + 1
    memory.note_big_work(memory.BIG_BYTES, delay=0.01)  # the next big body schedules again
    deadline = time.monotonic() + 30
    while memory.trims == before + 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert memory.trims == before + 2


@pytest.mark.skipif(not memory.available(), reason="the C library has no malloc_trim (not glibc)")
def test_trim_hands_freed_heap_back():
    def rss_kb() -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    memory.trim_now()
    base = rss_kb()
    # Blocks from the C heap (not Python's arenas): 8 KiB bytearrays, 200 MiB; one in 64 stays alive, so
    # the freed space is holes in the heap that free() alone never returns.
    blocks = [bytearray(8192) for _ in range(25_000)]
    grown = rss_kb()
    keep = blocks[::64]
    del blocks
    held = rss_kb()
    memory.trim_now()
    after = rss_kb()
    assert grown - base > 150_000
    assert held - base > (grown - base) / 2, "free() returned the holes by itself: the test shows nothing"
    assert after - base < (grown - base) / 4
    del keep


def test_the_start_up_heap_is_frozen_and_garbage_is_not():
    import gc

    from proxy import memory

    class Cyclic:
        pass

    a = Cyclic()
    a.me = a  # garbage once dropped: collected before the freeze, not frozen with the rest
    ref = __import__("weakref").ref(a)
    del a
    try:
        assert memory.freeze_startup_heap() > 0
        assert ref() is None
    finally:
        gc.unfreeze()


def test_keep_free_heap_is_set_where_glibc_is():
    """`ctproxy up` lets glibc keep a big body's freed heap for the next one (proxy/memory.keep_free_heap); the
    trim after big work still hands it back."""
    assert memory.keep_free_heap() is memory.available()
    if memory.available():
        assert memory.trim_now()
