"""The cyclic collector waits while a big parsed body is in flight (it is freed by reference counting).

A parsed 1.5 MB Responses body is thousands of dicts and lists. Parsing it allocates past the young
generation's threshold, so a collection runs right after the parse, walks the whole fresh tree (all of it
alive) and promotes it, and the next middle-generation collection walks it again. Measured in `ctproxy up`
(80 requests of 1.5 MB, gc callbacks): one young collection per request, ≈4,200 live young lists and dicts
each time (the body), 332 ms in all. JSON trees hold no cycles: reference counting frees them when the flow
ends (`FlowState.release`), so the collector has nothing to find in them.

So a big body is parsed under a `Hold`: automatic collection is off from just before the parse while any
hold is open, and back on when the last one closes (the flow's state is released, or freed). What the
proxy makes meanwhile that is cyclic waits for that moment. Never for long: a watchdog on the event loop
collects the young and middle generations itself once the collector has been off for `MAX_PAUSE` seconds,
and every tenth time all of them (a hold that is never closed — a flow dropped without its last hook —
closes when the collector frees that flow's state). The collector is never touched when it was off
already (a host program's choice) or outside an event loop.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import weakref
from typing import Any

BIG_BODY = 256 * 1024  # a body at least this big holds the collector; smaller ones are not worth it
MAX_PAUSE = 0.5  # seconds: the collector never waits longer than this (then the watchdog collects)
FULL_EVERY = 10  # every tenth watchdog collection is a full one

_lock = threading.Lock()
_open = 0  # holds not closed yet
_since = 0.0  # when the collector was turned off, or last collected by the watchdog (monotonic)
_ours = False  # the collector is off because of us (and we turn it back on)
forced = 0  # watchdog collections (tests)


class Hold:
    """One big body in flight. `close()` is idempotent; a hold tied to an owner closes when it is freed."""

    __slots__ = ("__weakref__", "_closed")

    def __init__(self) -> None:
        self._closed = False

    def close(self) -> None:
        global _open, _ours
        with _lock:
            if self._closed:
                return
            self._closed = True
            _open -= 1
            if _open == 0 and _ours:
                _ours = False
                gc.enable()


def hold_for(owner: Any, nbytes: int) -> Hold | None:
    """A hold for a body of `nbytes` about to be parsed for `owner` (closed when `owner` is freed, at the
    latest); None when the body is small, the collector is off already, or no event loop runs the watchdog."""
    global _open, _since, _ours
    if nbytes < BIG_BODY:
        return None
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    with _lock:
        if _open == 0:
            if not gc.isenabled():
                return None  # off by someone else's choice: leave it to them
            gc.disable()
            _ours, _since = True, time.monotonic()
            loop.call_later(MAX_PAUSE, _watch, loop)
        elif not _ours:
            return None
        _open += 1
    hold = Hold()
    weakref.finalize(owner, hold.close)
    return hold


def _watch(loop: asyncio.AbstractEventLoop) -> None:
    """Collect now if the collector has been off for `MAX_PAUSE` (holds come and go under load)."""
    global _since, forced
    with _lock:
        if not _ours:
            return
        due = time.monotonic() - _since >= MAX_PAUSE
    if due:
        # The young and middle generations (where what was made meanwhile is), and every tenth time the
        # oldest too, as the collector's own thresholds would: a pause that never ends (big streamed
        # requests, one after another) must not keep old cyclic garbage forever.
        gc.collect(2 if forced % FULL_EVERY == FULL_EVERY - 1 else 1)
        forced += 1
        with _lock:
            _since = time.monotonic()
    try:
        loop.call_later(MAX_PAUSE, _watch, loop)
    except RuntimeError:  # the loop is closed: nothing runs any more
        pass


def paused() -> bool:
    return _ours
