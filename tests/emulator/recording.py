"""What the emulator received: one `ReceivedRequest` per HTTP request, raw bytes kept verbatim.

Bodies are decoded here (Content-Encoding) for parsing only; `raw_body` is what came off the
wire, so transparency tests can compare bytes exactly.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import orjson


class BodyDecodeError(ValueError):
    """The request body could not be decoded with its declared Content-Encoding."""


def decode_body(raw: bytes, content_encoding: str | None) -> bytes:
    """Undo every listed Content-Encoding (applied left to right, so undone right to left)."""
    if not content_encoding:
        return raw
    data = raw
    for enc in reversed([e.strip().lower() for e in content_encoding.split(",") if e.strip()]):
        data = _decode_one(data, enc)
    return data


def _decode_one(data: bytes, enc: str) -> bytes:
    try:
        if enc == "identity":
            return data
        if enc in ("gzip", "x-gzip"):
            return zlib.decompress(data, 16 + zlib.MAX_WBITS)
        if enc == "deflate":
            try:
                return zlib.decompress(data)
            except zlib.error:  # some clients send raw deflate without the zlib header
                return zlib.decompress(data, -zlib.MAX_WBITS)
        if enc == "br":
            import brotli

            return brotli.decompress(data)
        if enc == "zstd":
            import zstandard

            # Streaming frames may lack a content size, so read through a stream reader.
            return zstandard.ZstdDecompressor().decompressobj().decompress(data)
    except Exception as exc:
        raise BodyDecodeError(f"could not decode {enc} request body: {exc}") from exc
    raise BodyDecodeError(f"unsupported Content-Encoding {enc!r}")


def parse_json(body: bytes, content_type: str | None) -> Any | None:
    """Parsed JSON when the body is JSON (declared, or looks like it); None otherwise."""
    looks_json = body[:1] in (b"{", b"[")
    if not body or not (looks_json or (content_type and "json" in content_type.lower())):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


@dataclass
class ReceivedRequest:
    """One request as the emulator saw it. `headers` keeps wire case, order and duplicates."""

    method: str
    path: str
    query: str  # the raw query string, without '?'
    headers: list[tuple[str, str]]
    raw_body: bytes  # exactly as received (possibly compressed)
    body: bytes  # after Content-Encoding decoding
    json: Any | None  # parsed body when it is JSON
    received_at: float  # loop.time() when the body was fully read
    route: str  # "responses", "compaction", "compact", "retrieve", "delete", "input_tokens", "other"
    response_id: str | None = None  # the id of the Response the emulator answered with
    status: int | None = None  # HTTP status the emulator answered with
    client_disconnected: bool = False  # the client went away while the answer was streaming
    events_sent: int = 0  # SSE events (or Raw chunks) written before the stream ended
    write_times: list[float] = field(default_factory=list)  # loop.time() after each streamed write
    answered_at: float | None = None  # loop.time() once the whole answer was handed to the transport
    transport: str = "http"  # "ws": a `response.create` message of the Responses WebSocket mode
    ws_connection: int | None = None  # which WebSocket connection (1, 2, …) it came over
    extra: dict[str, Any] = field(default_factory=dict)

    def header(self, name: str, default: str | None = None) -> str | None:
        """First value of a header, case-insensitively."""
        low = name.lower()
        for key, value in self.headers:
            if key.lower() == low:
                return value
        return default

    def header_all(self, name: str) -> list[str]:
        low = name.lower()
        return [v for k, v in self.headers if k.lower() == low]

    @property
    def input_items(self) -> list[Any]:
        """The request's `input` as a list of items (a bare string becomes one user message)."""
        body = self.json if isinstance(self.json, dict) else {}
        inp = body.get("input")
        if isinstance(inp, str):
            return [{"role": "user", "content": inp}]
        return list(inp) if isinstance(inp, list) else []

    @property
    def tool_names(self) -> list[str]:
        body = self.json if isinstance(self.json, dict) else {}
        tools = body.get("tools") or []
        return [t.get("name") or t.get("type", "") for t in tools if isinstance(t, dict)]
