"""proxy/memory.py: a big body schedules one trim of the C heap, off the event loop."""

from __future__ import annotations

import ctypes
import ctypes.util
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


def _malloced_bytes() -> int:
    """Bytes of live malloc'd blocks that glibc gave their own mmap (mallinfo2's hblkhd): simdjson's parser buffers
    for a big document are such blocks."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                         "fsmblks", "uordblks", "fordblks", "keepcost")]

    fn = ctypes.CDLL(ctypes.util.find_library("c")).mallinfo2
    fn.restype = MallInfo2
    info = fn()
    return info.uordblks + info.hblkhd


def _has_mallinfo2() -> bool:
    try:
        return memory.available() and hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _has_mallinfo2(), reason="needs glibc's mallinfo2 to see the parser's blocks")
async def test_a_big_bodys_parser_is_released_once_its_flow_is_done():
    """Issue 32 point 4: a 100,000-item request may cost what its body costs while in flight, and nothing after.
    simdjson keeps its parser (tape, strings, index: ≈10× the document) sized for the biggest body it read; before
    session 14 that stayed for the life of the process (≈88 MB after one 6 MB request)."""
    import asyncio
    import weakref

    import orjson
    from mitmproxy.test import tflow, tutils

    from proxy.host import flowstate
    from proxy.host.flowbody import responses_body
    from proxy.items.lazyitems import LazyItems

    raw = orjson.dumps({"model": "gpt-5", "input": [
        {"type": "message", "role": "user" if i % 2 == 0 else "assistant", "content": f"item {i}"}
        for i in range(100_000)]})
    req = tutils.treq(method=b"POST", scheme=b"https", host="api.openai.com", port=443, path=b"/v1/responses",
                      content=raw, headers=((b"content-type", b"application/json"),))
    flow = tflow.tflow(req=req)
    memory.release_parser()
    before = _malloced_bytes()
    body = responses_body(flow)
    assert body is not None and isinstance(body.view["input"], LazyItems)
    items = weakref.ref(body.view["input"])
    held = _malloced_bytes() - before
    assert held > 30 << 20, f"the parse held only {held >> 20} MB: the test shows nothing"
    del body
    flowstate.release(flow)  # the exchange is over
    assert items() is None, "the flow's parsed body outlived its flow"
    deadline = asyncio.get_running_loop().time() + 60
    while _malloced_bytes() - before > held // 4 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.02)  # the release runs on this loop, the trim on a timer thread
    left = _malloced_bytes() - before
    assert left <= held // 4, f"{left >> 20} MB of the parse's {held >> 20} MB stayed after the flow"


def _pymalloc_arenas() -> int:
    """pymalloc's arenas in use now (`sys._debugmallocstats`, as the bench's probe reads it)."""
    from bench.memprobe import mallocstats

    return mallocstats()["arenas allocated current"]


@pytest.mark.skipif(not memory.available(), reason="the trim runs where glibc is")
def test_the_trim_empties_the_free_lists_that_pin_a_big_requests_arenas():
    """Issue 32 point 4 (session 15, bench/memprobe.py inside `ctproxy up`): after big requests, thousands of
    tuples sat in the interpreter's free list (kept for reuse when freed, up to 2,000 of each length), each in
    a different arena of the request's peak, and an arena goes back to the OS only when all of it is free. The
    trim after big work runs a full collection, which empties the free lists."""
    import gc
    import random

    gc.collect()
    base = _pymalloc_arenas()
    rows = [(i, -i) for i in range(1_000, 400_000)]  # ≈25 MB of 2-tuples and ints: ≈25 arenas of 1 MiB
    random.Random(32).shuffle(rows)  # freed in this order: the first 2,000 freed land in every arena
    grown = _pymalloc_arenas() - base
    del rows
    pinned = _pymalloc_arenas() - base
    assert grown >= 15 and pinned >= grown // 2, (grown, pinned)  # else the test shows nothing
    before = memory.collections
    memory.note_big_work(memory.BIG_BYTES, delay=0.01)  # (a trim still pending from another test collects later)
    deadline = time.monotonic() + 60
    while memory.collections == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert memory.collections > before
    left = _pymalloc_arenas() - base
    assert left <= 3, f"{left} of the {grown} arenas stayed after the trim ({pinned} before it)"


@pytest.mark.skipif(not memory.available(), reason="the trim runs where glibc is")
def test_the_collection_waits_until_big_bodies_stop_coming(monkeypatch):
    """The full collection walks what the journal caches (≈18 ms per 100,000-item session): a trim that saw
    more big work noted while it waited hands pages back without it, and looks again a moment later."""
    deadline = time.monotonic() + 60
    while memory._timer is not None and time.monotonic() < deadline:  # what other tests left pending
        time.sleep(0.01)
    collections = memory.collections
    seen: list[int] = []  # full collections so far, as each trim saw them
    trim = memory.trim_now
    monkeypatch.setattr(memory, "trim_now", lambda: (seen.append(memory.collections - collections), trim())[1])
    memory.note_big_work(memory.BIG_BYTES, delay=0.05)
    memory.note_big_work(memory.BIG_BYTES)  # a second big body while the trim waits
    while len(seen) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen[:2] == [0, 1]  # the first trim (busy) did not collect, the next one (quiet since) did


_HEAPS_SCRIPT = """
import ctypes, ctypes.util, sys, tempfile, threading
from proxy import memory
if sys.argv[1] == "one":
    assert memory.one_heap()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
def work():
    global kept
    kept = [bytes(1024 + i % 7) for i in range(4000)]  # 1 KB blocks: malloc's, not pymalloc's
t = threading.Thread(target=work)
t.start()
t.join()
libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
with tempfile.NamedTemporaryFile(suffix=".xml") as out:
    f = libc.fopen(out.name.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
    print(open(out.name).read().count("<heap nr="))
"""


@pytest.mark.skipif(not memory.available(), reason="the C library has no malloc_trim (not glibc)")
def test_one_heap_keeps_a_new_threads_allocations_in_the_main_heap():
    """`ctproxy up` and its workers call `memory.one_heap()` before their threads start: the journal writer's
    thread then allocates from glibc's main heap, whose freed pages the trim gives back, not from an arena of its
    own that kept ≈5 MB resident after a big request (bench_soak --only mem). Counted with malloc_info(3)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]

    def heaps(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _HEAPS_SCRIPT, mode], cwd=root, capture_output=True, text=True,
                             timeout=120, check=True)
        return int(out.stdout.strip())

    assert heaps("default") == 2  # glibc's usual: the thread gets an arena of its own
    assert heaps("one") == 1


def test_one_heap_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_trim", None)
    assert memory.one_heap() is False and memory.keep_free_heap() is False
