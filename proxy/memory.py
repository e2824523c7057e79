"""Give memory back to the operating system after big requests (glibc; elsewhere a no-op).

Measured (bench/bench_soak.py, big): after five 100k-item requests the proxy's live Python objects were
≈170 MB (tracemalloc), its RSS 1.1 GB. The rest was freed memory that glibc's malloc kept: per-thread
arenas (the journal's writer thread builds most of a big request's objects) and a heap top that is only
trimmed when it is free at its very end. `malloc_trim(0)` hands every free page back (≈800 MB of the
1.1 GB there). It walks the arenas, so it is not called per request: `note_big_work()` marks that a big
body passed, and a daemon timer trims once, a moment later, off the event loop (ctypes releases the GIL
for the call).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
from collections.abc import Callable

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
trims = 0  # how many trims ran (tests, status)


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


def _fire() -> None:
    global _timer
    with _lock:
        _timer = None
    try:
        trim_now()
    except Exception as exc:  # never let housekeeping take anything down
        log.error("memory: trim failed (%s)", type(exc).__name__)


def note_big_work(nbytes: int, delay: float = TRIM_DELAY) -> None:
    """A body of `nbytes` is being handled: once it is gone, trim (at most one trim pending at a time)."""
    global _timer
    if _trim is None or nbytes < BIG_BYTES:
        return
    with _lock:
        if _timer is not None:
            return
        _timer = threading.Timer(delay, _fire)
        _timer.daemon = True
        _timer.name = "ctproxy-trim"
        _timer.start()


KEPT_FREE_HEAP = 64 << 20  # bytes of free heap top glibc keeps instead of returning them at once
_M_TRIM_THRESHOLD = -1  # mallopt(3)


def keep_free_heap(nbytes: int = KEPT_FREE_HEAP) -> bool:
    """Let glibc keep up to `nbytes` of free memory at the top of its heap (`M_TRIM_THRESHOLD`; default 128 KB,
    which hands back the memory of every big body the moment it is freed, so that the next one's parse takes its
    pages again from the kernel, page fault by page fault). Measured inside `ctproxy up` on bench b (1.5 MB
    requests one after another): the body's parse 1.60-1.72 → 1.33-1.45 ms. The trim after big work
    (`note_big_work`) still returns all of it once the traffic stops. False where there is no glibc."""
    name = ctypes.util.find_library("c")
    if not name or _trim is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_TRIM_THRESHOLD, nbytes))


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
