"""The rolling preview of one output stream and the budgeted read of both (seed 004 §5.6).

A preview keeps the newest unread output, at most 256 KiB of UTF-8, and drops whole code
points from the front when it overflows, counting what it dropped. A read drains both
previews under one byte budget, stdout first; what does not fit is cut from the middle.
Pure: no I/O, no clocks.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

from tools_server.shell import limits


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


def start_at_code_point(data: bytes | bytearray, index: int) -> int:
    """The first index >= `index` that starts a code point (valid UTF-8 assumed)."""
    n = len(data)
    while index < n and _is_continuation(data[index]):
        index += 1
    return index


def end_at_code_point(data: bytes | bytearray, index: int) -> int:
    """The last index <= `index` that ends a whole code point (valid UTF-8 assumed)."""
    if index >= len(data):
        return len(data)
    while index > 0 and _is_continuation(data[index]):
        index -= 1
    return index


class StreamDecoder:
    """Incremental UTF-8 decoding: a code point split across chunks is held until complete.

    Returns valid UTF-8 bytes. Valid input passes through without a decode/encode round trip;
    only invalid bytes go through the replacing decoder (U+FFFD).
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._held = b""  # the start of a code point split across chunks

    def feed(self, data: bytes) -> bytes:
        if self._held:
            data = self._held + data
            self._held = b""
        if data.isascii():
            return data
        try:
            _, consumed = codecs.utf_8_decode(data, "strict", False)
        except UnicodeDecodeError:
            text = self._decoder.decode(data)
            return text.encode("utf-8") if text else b""
        if consumed < len(data):
            self._held = data[consumed:]
            return data[:consumed]
        return data

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        text = self._decoder.decode(held, final=True)
        return text.encode("utf-8") if text else b""


@dataclass
class Drained:
    """What one read took from a preview."""

    data: bytes  # what was still in the preview
    total_bytes: int  # everything produced since the previous read (including dropped)
    dropped_bytes: int  # lost from the front of the preview before this read
    lines: int  # newlines produced since the previous read


class RollingPreview:
    def __init__(self, limit: int = limits.PREVIEW_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._total = 0
        self._dropped = 0
        self._lines = 0

    def append(self, data: bytes) -> None:
        """`data` is valid UTF-8 (from StreamDecoder)."""
        if not data:
            return
        self._total += len(data)
        self._lines += data.count(b"\n")
        if len(data) >= self.limit:
            self._dropped += len(self._buf)
            self._buf = bytearray(data)
        else:
            self._buf += data
        if len(self._buf) > 2 * self.limit:  # trim in batches: one memmove per `limit` bytes
            self._trim()

    def _trim(self) -> None:
        excess = len(self._buf) - self.limit
        if excess > 0:
            cut = start_at_code_point(self._buf, excess)
            del self._buf[:cut]
            self._dropped += cut

    def drain(self) -> Drained:
        self._trim()
        out = Drained(bytes(self._buf), self._total, self._dropped, self._lines)
        self._buf = bytearray()
        self._total = self._dropped = self._lines = 0
        return out


@dataclass
class StreamView:
    """One stream's part of a read result."""

    text: str
    total_bytes: int
    shown_bytes: int
    dropped_bytes: int  # lost by the rolling preview before this read
    truncated_bytes: int  # left out of this read by the output budget
    lines: int

    @property
    def clipped(self) -> bool:
        return self.dropped_bytes > 0 or self.truncated_bytes > 0


def _marker(omitted_bytes: int) -> bytes:
    tokens = -(-omitted_bytes // limits.BYTES_PER_TOKEN)
    return f"\n…{tokens} tokens truncated…\n".encode()


def fit(data: bytes, budget: int) -> tuple[bytes, int]:
    """Cut `data` to at most `budget` bytes from the middle, at code point boundaries.

    Returns the shown bytes (with a marker where the middle was cut) and how many bytes of
    `data` were left out. The marker counts against the budget when the budget has room.
    """
    if len(data) <= budget:
        return data, 0
    room = budget - len(_marker(len(data)))
    if room <= 0:
        return b"", len(data)
    head_end = end_at_code_point(data, room // 2)
    tail_start = start_at_code_point(data, len(data) - (room - head_end))
    omitted = tail_start - head_end
    return data[:head_end] + _marker(omitted) + data[tail_start:], omitted


def view(drained: Drained, budget: int) -> tuple[StreamView, int]:
    """Render one drained stream under `budget`; returns the view and the budget left."""
    shown, omitted = fit(drained.data, max(0, budget))
    used = min(len(shown), max(0, budget))
    return (
        StreamView(
            text=shown.decode("utf-8", errors="replace"),
            total_bytes=drained.total_bytes,
            shown_bytes=len(drained.data) - omitted,
            dropped_bytes=drained.dropped_bytes,
            truncated_bytes=omitted,
            lines=drained.lines,
        ),
        max(0, budget - used),
    )


def read_both(stdout: Drained, stderr: Drained, budget: int) -> tuple[StreamView, StreamView]:
    """One `maxOutputBytes` budget per read, stdout first."""
    out_view, left = view(stdout, budget)
    err_view, _ = view(stderr, left)
    return out_view, err_view
