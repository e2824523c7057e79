"""The one `debug` switch (seed 004 §8): one line per event on stderr, off by default.

Only categories, counts, ids, hosts, timings and statuses are collected. Nothing here can carry a
header, token, prompt, tool argument or result, image, base64, opaque item or fallback text: keys
come from a fixed list and string values must be short identifier-like tokens (no spaces), so a
caller cannot pass free text by mistake. Values that do not qualify are replaced, not printed.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

# The only field names a debug line may carry.
ALLOWED_KEYS: frozenset[str] = frozenset({
    "feature", "outcome", "reason", "route", "kind", "model", "host", "status", "ms", "count",
    "items", "retained", "input_items", "output_items", "compaction_items", "tokens", "estimate",
    "window", "threshold", "request_id", "response_id", "session", "checkpoint", "strategy",
    "attempt", "types", "bytes", "code", "phase", "stream",
})

_TOKEN = re.compile(r"^[A-Za-z0-9_.:@/+=,-]{1,96}$")
Value = int | float | bool | str | None

_lock = threading.Lock()
_enabled = False
_stream: TextIO | None = None


def set_enabled(enabled: bool, stream: TextIO | None = None) -> None:
    """Turn debug output on or off; `stream` defaults to stderr (tests pass their own)."""
    global _enabled, _stream
    _enabled = bool(enabled)
    if stream is not None:
        _stream = stream


def reset_stream() -> None:
    global _stream
    _stream = None


def enabled() -> bool:
    return _enabled


def safe_value(value: object) -> Value:
    """The value if it is a number, bool, None or a short identifier-like token; '?' otherwise."""
    if value is None or isinstance(value, (bool, int)):  # (a tuple: a union is checked slower)
        return value  # type: ignore[return-value]
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, str) and _TOKEN.match(value):
        return value
    return "?"


def format_line(feature: str, fields: dict[str, object]) -> str:
    parts = [f"feature={safe_value(feature)}"]
    for key in sorted(fields):
        if key not in ALLOWED_KEYS or key == "feature":
            continue
        parts.append(f"{key}={safe_value(fields[key])}")
    return "ctproxy-debug " + " ".join(parts)


def event(feature: str, **fields: object) -> None:
    """Write one debug line when debug is on; a no-op otherwise."""
    if not _enabled:
        return
    line = format_line(feature, fields)
    out = _stream or sys.stderr
    with _lock:
        try:
            out.write(line + "\n")
            out.flush()
        except (OSError, ValueError):  # a closed stderr must never break a request
            pass


@contextmanager
def timed(feature: str, **fields: object) -> Iterator[dict[str, object]]:
    """Times a block; the caller may add fields (e.g. outcome) to the yielded dict."""
    extra: dict[str, object] = dict(fields)
    start = time.perf_counter()
    try:
        yield extra
    finally:
        extra.setdefault("ms", (time.perf_counter() - start) * 1000)
        event(feature, **extra)


def item_types(items: object) -> str:
    """`message:3,function_call:2`: content-block types and counts, never content."""
    counts: dict[str, int] = {}
    if isinstance(items, list):
        for item in items:
            typ = item.get("type") if isinstance(item, dict) else None
            if not isinstance(typ, str) or not _TOKEN.match(typ):
                typ = "message" if isinstance(item, dict) and "role" in item else "other"
            counts[typ] = counts.get(typ, 0) + 1
    return ",".join(f"{k}:{v}" for k, v in sorted(counts.items())) or "none"


_saved: tuple[bool, int, int, int] | None = None


def restore_logging() -> None:
    """Undo `configure_logging` (ctproxy up embedded in a process that goes on: tests, a host program)."""
    import logging

    global _saved
    if _saved is None:
        return
    ours, mitm = logging.getLogger("ctproxy"), logging.getLogger("mitmproxy")
    for h in list(ours.handlers):
        if getattr(h, "_ctp_stderr", False):
            ours.removeHandler(h)
            if h in mitm.handlers:
                mitm.removeHandler(h)
    ours.propagate, level, requests_level, mitm_level = _saved
    ours.setLevel(level)
    logging.getLogger("ctproxy.requests").setLevel(requests_level)
    mitm.setLevel(mitm_level)
    _saved = None


def configure_logging(*, debug: bool, request_log: bool, stream: TextIO | None = None) -> None:
    """ctproxy's own loggers to stderr, and only those (issue 17): warnings always; the request log
    (`ctproxy.requests`, one line per request) at info unless `--quiet`; with `--debug` every `ctproxy.*`
    logger at debug and mitmproxy's warnings, never the DEBUG chatter of asyncio, filelock or mcp."""
    import logging

    set_enabled(debug)
    ours = logging.getLogger("ctproxy")
    mitm = logging.getLogger("mitmproxy")
    global _saved
    if _saved is None:  # what `restore_logging` puts back when an embedded `ctproxy up` ends
        _saved = (ours.propagate, ours.level, logging.getLogger("ctproxy.requests").level, mitm.level)
    handler = next((h for h in ours.handlers if getattr(h, "_ctp_stderr", False)), None)
    if handler is None:
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(message)s", "%H:%M:%S"))
        handler._ctp_stderr = True  # type: ignore[attr-defined]
        ours.addHandler(handler)
    for h in list(ours.handlers):  # mitm_master's warnings handler would print the same lines twice
        if getattr(h, "_ctp_warnings", False):
            ours.removeHandler(h)
    handler.setLevel(logging.DEBUG)
    ours.setLevel(logging.DEBUG if debug else logging.WARNING)
    ours.propagate = False  # mitmproxy's terminal log (mitmdump) must not print them a second time
    logging.getLogger("ctproxy.requests").setLevel(logging.INFO if request_log or debug else logging.WARNING)
    if debug and handler not in mitm.handlers:
        mitm.addHandler(handler)
        if mitm.level == logging.NOTSET or mitm.level < logging.WARNING:
            mitm.setLevel(logging.WARNING)
