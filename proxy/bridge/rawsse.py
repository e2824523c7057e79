"""An upstream event stream split into whole events, each kept as the bytes it came in (pure).

The bridge's merger passes most events of a round to the agent unchanged (text deltas and the like: the
bulk of a stream); splitting on the blank line and keeping each event's own bytes lets it do so without
decoding or re-framing them. Only `\\n`-framed streams are split here (what the Responses API sends): once
a `\\r` shows up, the rest of the stream goes through the full decoder (`proxy.items.sse.SSEDecoder`) and comes
out as decoded events instead.
"""

from __future__ import annotations

from proxy.items.sse import SSEDecoder, SSEEvent


class EventSplitter:
    """Feed chunks, get whole events: `bytes` (one event's block, its blank line included) while the stream
    is `\\n`-framed, `SSEEvent`s once it is not."""

    def __init__(self) -> None:
        self._buf = b""
        self._decoder: SSEDecoder | None = None

    def feed(self, chunk: bytes) -> list[bytes] | list[SSEEvent]:
        if self._decoder is not None:
            return self._decoder.feed(chunk)
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:  # CR / CRLF line ends: the full decoder from here on (a CR may split a CRLF)
            self._buf = b""
            self._decoder = SSEDecoder()
            return self._decoder.feed(buf)
        blocks = buf.split(b"\n\n")
        self._buf = blocks.pop()  # the unfinished last event (empty when the chunk ended one)
        return [b + b"\n\n" for b in blocks if b]

    def close(self) -> list[SSEEvent]:
        """End of stream: what is left, decoded (a last event without its blank line is still dispatched)."""
        if self._decoder is None:
            self._decoder = SSEDecoder()
            rest, self._buf = self._buf, b""
            out = self._decoder.feed(rest)
            return [*out, *self._decoder.close()]
        return self._decoder.close()


def decode_block(block: bytes) -> list[SSEEvent]:
    """The events of one block (a block ends with its blank line, so nothing is left over)."""
    return SSEDecoder().feed(block)
