"""Server-sent events: an incremental decoder and a tap that watches a Responses stream.

The decoder handles events split across chunks, `\\r\\n` / `\\r` line endings, multi-line
`data:`, comments and a `[DONE]` sentinel. The tap never changes bytes; it only observes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson


@dataclass(frozen=True)
class SSEEvent:
    event: str | None
    data: str
    id: str | None = None

    def json(self) -> Any:
        return orjson.loads(self.data)


class SSEDecoder:
    """Feed bytes, get whole events. Keeps at most one partial line plus one partial event."""

    def __init__(self) -> None:
        self._buf = b""
        self._event: str | None = None
        self._data: list[str] = []
        self._id: str | None = None
        self._pending_cr = False

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        if self._pending_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the \n of a \r\n split across chunks
        self._pending_cr = False
        buf = self._buf + chunk
        out: list[SSEEvent] = []
        start = 0
        n = len(buf)
        while start < n:
            nl = buf.find(b"\n", start)
            cr = buf.find(b"\r", start, nl if nl != -1 else n)
            if cr != -1:
                end, nxt = cr, cr + 1
                if nxt < n and buf[nxt : nxt + 1] == b"\n":
                    nxt += 1
                elif nxt == n:
                    self._pending_cr = True
            elif nl != -1:
                end, nxt = nl, nl + 1
            else:
                break
            self._line(buf[start:end], out)
            start = nxt
        self._buf = buf[start:]
        return out

    def close(self) -> list[SSEEvent]:
        """End of stream: a trailing event without its blank line is still dispatched."""
        out: list[SSEEvent] = []
        if self._buf:
            self._line(self._buf, out)
            self._buf = b""
        self._line(b"", out)
        return out

    def _line(self, raw: bytes, out: list[SSEEvent]) -> None:
        if not raw:
            if self._data:
                out.append(SSEEvent(self._event, "\n".join(self._data), self._id))
            self._event, self._data = None, []
            return
        line = raw.decode("utf-8", errors="replace")
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            self._id = value


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

    def __call__(self, chunk: bytes) -> bytes:
        return self._fn(chunk) if self._fn else chunk


# Events whose payload the tap reads; the rest are only counted (their `event:` line names them).
PARSED_EVENTS = frozenset({
    "response.created", "response.queued", "response.in_progress", "response.output_item.done",
    "response.completed", "response.incomplete", "response.failed", "error",
})


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
    listeners: list[Callable[[str, dict[str, Any]], None]] = field(default_factory=list)

    def on_skipped(self, typ: str) -> None:
        """An event whose JSON the tap does not need (text deltas and the like): counted, not parsed."""
        self.events += 1
        if typ in ("response.output_item.added", "response.output_text.delta"):
            self.first_output_seen = True
        for listener in self.listeners:
            listener(typ, {})

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
        if isinstance(body.get("error"), dict):
            self.error = body["error"]
        self.completed = True

    @property
    def error_code(self) -> str | None:
        return (self.error or {}).get("code")


class StreamTap:
    """A `flow.response.stream` callable: passes every chunk through unchanged, decoding a copy."""

    def __init__(self, tap: ResponseTap, content_encoding: str = "", on_end: Callable[[], None] | None = None):
        self.tap = tap
        self._decoder = SSEDecoder()
        self._on_end = on_end
        self._ended = False
        try:
            self._decompress: _Decompressor | None = _Decompressor(content_encoding)
        except ValueError:
            self._decompress = None  # unknown encoding: pass through, observe nothing

    def __call__(self, chunk: bytes) -> bytes:
        if self._decompress is not None:
            try:
                if chunk:
                    self._dispatch(self._decoder.feed(self._decompress(chunk)))
                else:
                    self._dispatch(self._decoder.close())
            except Exception:  # observing must never break the stream
                self._decompress = None
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

    def _dispatch(self, events: list[SSEEvent]) -> None:
        for ev in events:
            if ev.data == "[DONE]":
                continue
            if ev.event is not None and ev.event not in PARSED_EVENTS:
                self.tap.on_skipped(ev.event)  # most of a stream is deltas: skip their JSON
                continue
            try:
                payload = orjson.loads(ev.data)
            except orjson.JSONDecodeError:
                continue
            if isinstance(payload, dict):
                self.tap.on_event(payload)


def encode_event(payload: dict[str, Any], event: str | None = None) -> bytes:
    """One SSE frame in the Responses wire format: `event:` line + `data:` JSON + blank line."""
    name = event or payload.get("type")
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"
