"""Give memory back to the operating system after big requests (glibc; elsewhere a no-op).

Measured (bench/bench_soak.py, big): after five 100k-item requests the proxy's live Python objects were
≈170 MB (tracemalloc), its RSS 1.1 GB. The rest was freed memory that glibc's malloc kept: per-thread
arenas (the journal's writer thread builds most of a big request's objects) and a heap top that is only
trimmed when it is free at its very end. `malloc_trim(0)` hands every free page back (≈800 MB of the
1.1 GB there). It walks the arenas, so it is not called per request: `note_big_work()` marks that a big
body passed, and a daemon timer trims once, a moment later, off the event loop (ctypes releases the GIL
for the call).

What stayed after that (issue 32 point 4, measured in session 14 with mallinfo2 and /proc/PID/maps inside `ctproxy up`
after one 100,000-item request and a streaming session of that size, once idle): no Python objects (the count of
blocks was back at the idle baseline), but ≈88 MB of live malloc'd blocks, each its own mmap: simdjson's parser
(fastsimdjson keeps one per thread, its tape, string buffer and structural index sized for the biggest document it
has read, for good). So the trim releases that parser first (`fastsimdjson.release()`), on the thread that parsed:
the event loop's (`note_big_parse`). A parse after the release costs what a parse on a warm parser costs
(measured, 5.9 MB: 9.5 against 8.7 ms; 1.3 MB: the same).

What stays after that is pymalloc's (session 15, bench/memprobe.py inside `ctproxy up`, `bench_soak --only mem
--mem-streams 3`, once idle): the live bytes are the baseline's, but in 71-77 arenas of 1 MiB instead of 43. An
arena goes back to the OS only when every block in it is free, and the ones a big request made kept a few blocks
each. Two kinds:
- the interpreter's free lists: 3,904 tuples with refcount 0 (kept for reuse, up to 2,000 of each length: the
  last ones the big request freed), the only blocks of four arenas. The trim now runs a full collection first
  (`collect_free_lists`), which empties them; it walks every object made since start-up (≈18 ms per cached
  100,000-item journal session), so it waits until the big bodies have stopped for a `TRIM_DELAY`, and skips
  while gcpause holds the collector off for a body in flight;
- the per-request bookkeeping made while the big request's objects were alive: after the collection, 168 blocks
  (9 KB) kept 28 arenas (1,780 touched pools, ≈28 MB). Every small allocation goes to the pool at the head of its
  size class's list, and during a big request's peak that is one of the peak's pools, so whatever is made then
  and kept lands among the per-item objects: the telemetry feed's records (29 blocks in 8 arenas), the usage
  cache (21 in 10), the rollover memo (15 in 8), compaction's session memo (10 in 7), the journal writer's
  counters, response aliases and bounded sets, the metrics' latency lists, sqlite3's cursor weakrefs, the
  DBWorker's last future, lru caches (docs/adr/0012-proxy-workers.md has the table). Moving them is not possible
  (a copy is made where the same list head points); what ends it is a peak that is not pymalloc's.

Session 17: the peak is the journal's (with history off the same run leaves +1.0 MB after idle, against ≈30 with
it). A big input's per-item work now goes to flat buffers, one item at a time (proxy/journal/branch.py ColumnView,
written as PutItems ops), and orjson's output is right-sized where it is held (proxy/items/jsonbytes.py: each held
serialization kept a 4 KiB buffer). What is left per item is the cached branch (an Entry, its id and its
canonical hash), alive while the session is (30 s idle for a big one, proxy/journal/journal.py).

Session 18 (bench/memprobe.py's peak watcher, `CTP_MEMPROBE_PEAK`): two readers still built a big input whole in
pymalloc while it was in flight (the session's claim walking it for a call, LazyItems keeping every item it built:
300,000 objects; the type summary's list of every view: 100,000); they now read it one item or one chunk at a
time. What stayed outside pymalloc was the journal writer thread's own glibc arena (≈5-6 MB resident after idle:
SQLite's page cache and freed chunks among a few live ones): the writer frees SQLite's caches once idle after
big work (`PRAGMA shrink_memory`), and every thread allocates from the main heap (`one_heap`), which the trim
empties. The last per-item objects, the journal's item ids, are a column of bytes (proxy/journal/itemids.py).
After idle: 24 → 2 MB over the baseline (docs/adr/0012-proxy-workers.md has the steps).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

log = logging.getLogger("ctproxy.memory")

BIG_BYTES = 1 << 20  # a body this big is worth a trim once it is gone
TRIM_DELAY = 2.0  # seconds after the first big body: the journal has usually settled it by then


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


_trim = _load_trim()
_lock = threading.Lock()
_timer: threading.Timer | None = None
_again = False  # big work was noted while the pending trim waited (big bodies keep coming)
trims = 0  # how many trims ran (tests, status)
parser_releases = 0  # how many times simdjson's parser was released (tests)
_parse_loop: asyncio.AbstractEventLoop | None = None  # the loop whose thread parsed a big body (its parser is there)
PARSER_RELEASE_WAIT = 5.0  # seconds the trim waits for the loop to release its parser (a busy loop: trim anyway)


def available() -> bool:
    return _trim is not None


def trim_now() -> bool:
    """Return free heap memory to the OS now; False where the C library has no malloc_trim."""
    global trims
    if _trim is None:
        return False
    _trim(0)
    trims += 1
    return True


def release_parser() -> None:
    """Free simdjson's parser and string caches of the calling thread (the next parse allocates them again)."""
    global parser_releases
    import fastsimdjson

    fastsimdjson.release()
    parser_releases += 1


collections = 0  # how many full collections the trim ran (tests)


def collect_free_lists() -> bool:
    """A full collection of the cyclic collector: it also empties the interpreter's free lists (tuples, lists,
    dicts, floats… kept for reuse when freed), whose blocks are the last ones a big request freed, spread
    over the arenas it made. Skipped (False) while a big body is in flight: the collector is held off for it
    (proxy/gcpause.py) and would walk its whole tree; the next trim collects."""
    global collections
    import gc

    from proxy import gcpause

    if gcpause.paused():
        return False
    gc.collect()
    collections += 1
    return True


def _release_parser_on(loop: asyncio.AbstractEventLoop, collect: bool) -> None:
    """Run `release_parser`, then (`collect`) `collect_free_lists`, on `loop`'s thread and wait (a bounded
    time) until they ran."""
    done = threading.Event()

    def run() -> None:
        try:
            release_parser()
            if collect:
                collect_free_lists()
        except Exception as exc:
            log.error("memory: parser release failed (%s)", type(exc).__name__)
        finally:
            done.set()

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError:  # the loop is closed: its thread parses nothing any more
        return
    done.wait(PARSER_RELEASE_WAIT)


def _fire() -> None:
    global _timer, _again
    with _lock:
        _timer = None
        busy, _again = _again, False
    try:
        # The full collection walks every object made since start-up (the journal's cached sessions: ≈18 ms
        # per 100,000 items), on the event loop: while big bodies keep coming it waits for the first quiet
        # `TRIM_DELAY` (the free lists matter once the big work has stopped, and one collection empties them).
        loop = _parse_loop
        if loop is not None and loop.is_running():
            _release_parser_on(loop, not busy)  # before the trim: the parser's blocks are what the trim hands back
        elif not busy:
            collect_free_lists()
        trim_now()
    except Exception as exc:  # never let housekeeping take anything down
        log.error("memory: trim failed (%s)", type(exc).__name__)
    if busy:
        note_big_work(BIG_BYTES)  # look again once the big bodies have stopped


def note_big_parse(owner: Any, nbytes: int) -> None:
    """simdjson just parsed a body of `nbytes` on this thread (the event loop's) into `owner` (the object that keeps
    its document alive, weakly referenceable; None when nothing does). Once `owner` is gone, the parser is released
    on this loop and the heap trimmed (`note_big_work`); while a document lives, its parser cannot be released, and
    it goes back to the thread's cache when the document does."""
    global _parse_loop
    if nbytes < BIG_BYTES:
        return
    try:
        _parse_loop = asyncio.get_running_loop()
    except RuntimeError:
        return  # no loop (scripts, tests): no timer can reach this thread
    if owner is None:
        note_big_work(nbytes)
    else:
        weakref.finalize(owner, note_big_work, nbytes)


def note_big_work(nbytes: int, delay: float = TRIM_DELAY) -> None:
    """A body of `nbytes` is being handled: once it is gone, trim (at most one trim pending at a time)."""
    global _timer, _again
    if (_trim is None and _parse_loop is None) or nbytes < BIG_BYTES:
        return
    with _lock:
        if _timer is not None:
            _again = True  # more big work while a trim is pending: that trim hands pages back, collects later
            return
        _timer = threading.Timer(delay, _fire)
        _timer.daemon = True
        _timer.name = "ctproxy-trim"
        _timer.start()


_M_ARENA_MAX = -8  # mallopt(3)


def one_heap() -> bool:
    """Have every thread made from now on allocate from glibc's main heap (`M_ARENA_MAX` 1), not from an arena of
    its own. The journal writer's thread builds a big request's rows and runs SQLite and FTS5 over them; its arena
    (a 64 MB mapping) kept ≈5 MB resident after idle that the trim could not give back, freed chunks among a few
    live ones; in the main heap the same work left ≈1.5 MB (bench_soak --only mem). Threads hold the GIL for
    nearly all their allocations, so one heap costs them no waiting (bench_proxy c and d measured level). Called
    before the threads start (a thread keeps the arena it first had). False where there is no glibc."""
    return _mallopt(_M_ARENA_MAX, 1)


def _mallopt(param: int, value: int) -> bool:
    name = ctypes.util.find_library("c")
    if not name or _trim is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(param, value))


KEPT_FREE_HEAP = 64 << 20  # bytes of free heap top glibc keeps instead of returning them at once
_M_TRIM_THRESHOLD = -1  # mallopt(3)


def keep_free_heap(nbytes: int = KEPT_FREE_HEAP) -> bool:
    """Let glibc keep up to `nbytes` of free memory at the top of its heap (`M_TRIM_THRESHOLD`; default 128 KB,
    which hands back the memory of every big body the moment it is freed, so that the next one's parse takes its
    pages again from the kernel, page fault by page fault). Measured inside `ctproxy up` on bench b (1.5 MB
    requests one after another): the body's parse 1.60-1.72 → 1.33-1.45 ms. The trim after big work
    (`note_big_work`) still returns all of it once the traffic stops. False where there is no glibc."""
    return _mallopt(_M_TRIM_THRESHOLD, nbytes)


def freeze_startup_heap() -> int:
    """Move everything alive once the proxy is up (mitmproxy, the chain, the modules: hundreds of thousands
    of objects) out of the cyclic collector's reach (`gc.freeze`). They live as long as the process; left in
    the oldest generation, every full collection walks them all, and the allocations of parsing a 1.5 MB
    request trigger such collections: measured, they doubled that parse (bench_proxy h, responses_body).
    Reference counting still frees frozen objects; only cycles among them are never collected."""
    import gc

    gc.collect()  # what is garbage now is not frozen with the rest
    gc.freeze()
    return gc.get_freeze_count()
