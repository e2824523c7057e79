"""Server-sent events: an incremental decoder and a tap that watches a Responses stream.

The decoder handles events split across chunks, `\\r\\n` / `\\r` line endings, multi-line
`data:`, comments and a `[DONE]` sentinel. The tap never changes bytes; it only observes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson


class SSEEvent(NamedTuple):  # a tuple: built once per event, a frozen dataclass costs ≈1 µs more
    event: str | None
    data: str
    id: str | None = None

    def json(self) -> Any:
        return orjson.loads(self.data)


RawEvent = tuple[bytes | None, bytes, str | None]  # (event name, data, last event id), as received


def _decoded(raw: RawEvent) -> SSEEvent:
    event, data, id_ = raw
    return SSEEvent(None if event is None else event.decode("utf-8", errors="replace"),
                    data.decode("utf-8", errors="replace"), id_)


class SSEDecoder:
    """Feed bytes, get whole events. Keeps at most one partial line plus one partial event.

    Works on bytes and splits each chunk once (a stream is mostly small delta events: per-line Python
    work is the cost); a field's value is decoded as UTF-8 when its event is dispatched."""

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[bytes] = []
        self._id: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        return [_decoded(raw) for raw in self.feed_raw(chunk)]

    def close(self) -> list[SSEEvent]:
        """End of stream: a trailing event without its blank line is still dispatched."""
        return [_decoded(raw) for raw in self.close_raw()]

    def feed_raw(self, chunk: bytes) -> list[RawEvent]:
        """`feed`, the name and data left undecoded: (event bytes, data bytes, id) per event. What the stream tap
        uses: it decodes only the few events it reads (orjson takes bytes), not every delta."""
        if not (self._buf or self._data or self._pending_cr) and chunk[:7] == b"event: " and chunk[-2:] == b"\n\n":
            # The usual chunk: one whole `event: NAME` + `data: JSON` event, nothing pending. The general path
            # below gives exactly this, a line at a time.
            nl = chunk.find(b"\n")
            if chunk[nl + 1:nl + 7] == b"data: " and chunk.find(b"\n", nl + 1) == len(chunk) - 2 and b"\r" not in chunk:
                return [(chunk[7:nl], chunk[nl + 7:-2], self._id)]
        if self._pending_cr and chunk[:1] == b"\n":
            chunk = chunk[1:]  # the \n of a \r\n split across chunks
        self._pending_cr = False
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            # CR and CRLF end lines too. A CR at the very end may be the first half of a CRLF.
            self._pending_cr = buf.endswith(b"\r")
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        self._buf = lines.pop()  # the unfinished last line (empty when the chunk ended a line)
        out: list[RawEvent] = []
        if lines:
            self._lines(lines, out)
        return out

    def close_raw(self) -> list[RawEvent]:
        out: list[RawEvent] = []
        lines = [self._buf, b""] if self._buf else [b""]
        self._buf = b""
        self._lines(lines, out)
        return out

    def _lines(self, lines: list[bytes], out: list[RawEvent]) -> None:
        # One loop over a chunk's lines, state in locals (a method call per line was most of the cost):
        # the two lines a Responses event has (`event: …`, `data: …`) take the first two branches.
        event, data = self._event, self._data
        for raw in lines:
            if raw[:6] == b"data: ":
                data.append(raw[6:])
            elif raw[:7] == b"event: ":
                event = raw[7:]
            elif not raw:
                if data:
                    out.append((event, data[0] if len(data) == 1 else b"\n".join(data), self._id))
                    data = []
                event = None
            elif raw[:1] == b":":
                continue  # a comment
            else:
                name, _, value = raw.partition(b":")
                if value[:1] == b" ":
                    value = value[1:]
                if name == b"data":
                    data.append(value)
                elif name == b"event":
                    event = value
                elif name == b"id":
                    self._id = value.decode("utf-8", errors="replace")
        self._event, self._data = event, data


class _Decompressor:
    """Incremental Content-Encoding decoding so the tap can read compressed streams."""

    def __init__(self, encoding: str):
        enc = encoding.strip().lower()
        self._fn: Callable[[bytes], bytes] | None
        if enc in ("", "identity"):
            self._fn = None
        elif enc in ("gzip", "x-gzip"):
            self._fn = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress
        elif enc == "deflate":
            self._fn = zlib.decompressobj().decompress
        elif enc == "br":
            import brotli

            self._fn = brotli.Decompressor().process
        elif enc == "zstd":
            import zstandard

            self._fn = zstandard.ZstdDecompressor().decompressobj().decompress
        else:
            raise ValueError(f"unsupported content-encoding {encoding!r}")

    @property
    def identity(self) -> bool:
        return self._fn is None

    def __call__(self, chunk: bytes) -> bytes:
        return self._fn(chunk) if self._fn else chunk


def decompressor(encoding: str) -> Callable[[bytes], bytes] | None:
    """An incremental decoder of a Content-Encoding (None for identity); ValueError for one it does not know."""
    dec = _Decompressor(encoding)
    return None if dec.identity else dec


# Events whose payload the tap reads; the rest are only counted (their `event:` line names them).
PARSED_EVENTS = frozenset({
    "response.created", "response.queued", "response.in_progress", "response.output_item.done",
    "response.completed", "response.incomplete", "response.failed", "error",
})


_PARSED_NAMES = frozenset(e.encode() for e in PARSED_EVENTS)
_FIRST_OUTPUT = ("response.output_item.added", "response.output_text.delta")
_FIRST_OUTPUT_NAMES = frozenset(e.encode() for e in _FIRST_OUTPUT)


@dataclass
class ResponseTap:
    """What a Responses stream (or JSON body) said: output items, usage, errors, completeness."""

    response_id: str | None = None
    model: str | None = None
    status: str | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    completed: bool = False  # a terminal event (completed/failed/incomplete/error) was seen
    incomplete: bool = False  # the stream ended (or broke) without a terminal event
    events: int = 0
    last_sequence: int | None = None
    first_output_seen: bool = False
    usage_recorded: bool = False
    # the upstream's Response.input_transformations (reasoning it dropped, e.g. prefix_mismatch; issue 47)
    input_transformations: list[Any] | None = None
    # Called with every event the tap parses (PARSED_EVENTS, which hold every terminal event), not with the
    # deltas it only counts: two calls per delta were a tenth of the tap's cost, for listeners that wait for the end.
    listeners: list[Callable[[str, dict[str, Any]], None]] = field(default_factory=list)

    def on_skipped(self, typ: str) -> None:
        """An event whose JSON the tap does not need (text deltas and the like): counted, not parsed."""
        self.events += 1
        if typ in _FIRST_OUTPUT:
            self.first_output_seen = True

    def on_event(self, payload: dict[str, Any]) -> None:
        self.events += 1
        typ = payload.get("type")
        if isinstance(seq := payload.get("sequence_number"), int):
            self.last_sequence = seq
        resp = payload.get("response")
        if isinstance(resp, dict):
            self.response_id = resp.get("id") or self.response_id
            self.model = resp.get("model") or self.model
            self.status = resp.get("status") or self.status
        if typ == "response.output_item.done" and isinstance(payload.get("item"), dict):
            self.items.append(payload["item"])
        elif typ in ("response.output_item.added", "response.output_text.delta"):
            self.first_output_seen = True
        elif typ in ("response.completed", "response.incomplete", "response.failed"):
            self.completed = True
            if isinstance(resp, dict):
                if isinstance(resp.get("usage"), dict):
                    self.usage = resp["usage"]
                if isinstance(resp.get("input_transformations"), list):
                    self.input_transformations = resp["input_transformations"]
                if not self.items and isinstance(resp.get("output"), list):
                    self.items = [i for i in resp["output"] if isinstance(i, dict)]
                if typ == "response.failed" and isinstance(resp.get("error"), dict):
                    self.error = resp["error"]
        elif typ == "error":
            self.completed = True
            err = payload.get("error") if isinstance(payload.get("error"), dict) else payload
            self.error = {k: err.get(k) for k in ("code", "message", "type", "param") if k in err}
        for listener in self.listeners:
            listener(typ or "", payload)

    def on_json_response(self, body: dict[str, Any]) -> None:
        """A non-streaming `Response` (or an error body)."""
        if isinstance(body.get("error"), dict) and body.get("object") != "response":
            self.error = body["error"]
            self.completed = True
            return
        self.response_id = body.get("id")
        self.model = body.get("model")
        self.status = body.get("status")
        self.items = [i for i in body.get("output") or [] if isinstance(i, dict)]
        if isinstance(body.get("usage"), dict):
            self.usage = body["usage"]
        if isinstance(body.get("input_transformations"), list):
            self.input_transformations = body["input_transformations"]
        if isinstance(body.get("error"), dict):
            self.error = body["error"]
        self.completed = True

    @property
    def error_code(self) -> str | None:
        return (self.error or {}).get("code")


class StreamTap:
    """A `flow.response.stream` callable: passes every chunk through unchanged, decoding a copy (a subclass that
    rewrites: proxy/host/clientecho.EchoTap)."""

    def __init__(self, tap: ResponseTap, content_encoding: str = "", on_end: Callable[[], None] | None = None):
        self.tap = tap
        self._decoder = SSEDecoder()
        self._on_end = on_end
        self._ended = False
        self.nbytes = 0  # what passed through (the request log's bytes out): counted here, not by a wrapper
        try:
            self._decompress: _Decompressor | None = _Decompressor(content_encoding)
        except ValueError:
            self._decompress = None  # unknown encoding: pass through, observe nothing
        # no content encoding: a chunk is the event bytes themselves (the fast path of `__call__`)
        self._plain = self._decompress is not None and self._decompress.identity

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        self.nbytes += len(chunk)
        if self._plain and chunk[-2:] == b"\n\n" and chunk[:7] == b"event: ":
            # The usual chunk of a stream: one whole event the tap only counts (a text delta), nothing of an
            # earlier chunk pending, no encoding. Counted here, as `_dispatch` would count it, without a decoder
            # pass (most of a stream is such chunks). Anything else takes the general path below.
            nl = chunk.find(b"\n")
            name = chunk[7:nl]
            if (name not in _PARSED_NAMES and chunk[nl + 1:nl + 7] == b"data: "
                    and chunk.find(b"\n", nl + 1) == len(chunk) - 2 and b"\r" not in chunk
                    and chunk[nl + 7:-2] != b"[DONE]"):
                dec = self._decoder
                if not (dec._buf or dec._data or dec._pending_cr):
                    tap = self.tap
                    tap.events += 1
                    if name in _FIRST_OUTPUT_NAMES:
                        tap.first_output_seen = True
                    return chunk
        if self._decompress is not None:
            try:
                if chunk:
                    self._dispatch(self._decoder.feed_raw(self._decompress(chunk)))
                else:
                    self._dispatch(self._decoder.close_raw())
            except Exception:  # observing must never break the stream
                self._decompress = None
                self._plain = False
        if not chunk:
            self.finish()
        return chunk

    def finish(self) -> None:
        if self._ended:
            return
        self._ended = True
        if not self.tap.completed:
            self.tap.incomplete = True
        if self._on_end:
            self._on_end()

    def _dispatch(self, events: list[RawEvent]) -> None:
        tap = self.tap
        for event, data, _id in events:
            if event is not None and event not in _PARSED_NAMES:
                if data != b"[DONE]":  # most of a stream is deltas: counted (`on_skipped`, inline), their JSON skipped
                    tap.events += 1
                    if event in _FIRST_OUTPUT_NAMES:
                        tap.first_output_seen = True
                continue
            if data == b"[DONE]":
                continue
            try:
                payload = orjson.loads(data)
            except orjson.JSONDecodeError:
                try:  # not UTF-8: read as the text decoder would (invalid bytes replaced)
                    payload = orjson.loads(data.decode("utf-8", errors="replace"))
                except orjson.JSONDecodeError:
                    continue
            if isinstance(payload, dict):
                tap.on_event(payload)


def encode_event(payload: dict[str, Any], event: str | None = None) -> bytes:
    """One SSE frame in the Responses wire format: `event:` line + `data:` JSON + blank line."""
    name = event or payload.get("type")
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"
