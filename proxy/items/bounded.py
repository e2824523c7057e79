"""A body decoded per its Content-Encoding, never past a limit (pure): gzip/deflate, br and zstd, the encodings
mitmproxy decodes, inflated in steps so that a decompression bomb stops near the limit. The request body's
codec (proxy/host/flowbody.py), the bridge's endpoint and the checkpoint turn's held answer all read bodies here."""

from __future__ import annotations

import zlib

from proxy.errors import CtproxyError

_CHUNK = 64 * 1024  # compressed input fed per step
_STEP = 1024 * 1024  # output produced per step: a bomb's peak memory stays near the limit, not twice it


class BodyTooLarge(CtproxyError, ValueError):
    """The decoded body would exceed the limit."""


class Unsupported(CtproxyError, ValueError):
    """An encoding (or a list of them) the bounded decoder does not know: mitmproxy would not decode it
    either, and the body stays untouched."""


def _inflate_zlib(raw: bytes, wbits: int, limit: int) -> bytes:
    out: list[bytes] = []
    size = 0
    data = raw
    while data:
        d = zlib.decompressobj(wbits)
        buf = data
        while True:
            room = min(_STEP, limit + 1 - size)
            chunk = d.decompress(buf, room)
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            out.append(chunk)
            buf = d.unconsumed_tail
            if d.eof or (not buf and len(chunk) < room):
                break
        if not d.eof:  # a truncated stream: what decoded, as mitmproxy's decoder returns it
            out.append(d.flush())
            break
        data = d.unused_data if wbits == 47 else b""  # further gzip members, as gzip.decompress reads them
    return b"".join(out)


def _inflate_brotli(raw: bytes, limit: int) -> bytes:
    import brotli

    d = brotli.Decompressor()
    out: list[bytes] = []
    size = 0
    bounded = hasattr(d, "can_accept_more_data")  # brotli >= 1.2 caps each step's output
    step = _CHUNK if bounded else 1024  # older brotli: small input steps bound the overshoot
    for start in range(0, len(raw), step):
        piece = raw[start:start + step]
        while True:
            chunk = d.process(piece, output_buffer_limit=min(_STEP, limit + 1 - size)) if bounded else d.process(piece)
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            out.append(chunk)
            piece = b""
            if not bounded or d.can_accept_more_data():
                break
    if hasattr(d, "is_finished") and not d.is_finished():
        raise ValueError("truncated brotli body")
    return b"".join(out)


def _inflate_zstd(raw: bytes, limit: int) -> bytes:
    import io

    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw), read_across_frames=True)
    out: list[bytes] = []
    size = 0
    while chunk := reader.read(min(_STEP, limit + 1 - size)):
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        out.append(chunk)
    return b"".join(out)


def decode_bounded(raw: bytes, encoding: str, limit: int) -> bytes:
    """`raw` decoded per Content-Encoding, never producing more than `limit` bytes (BodyTooLarge),
    ValueError when it does not decode, Unsupported for an encoding mitmproxy would not decode."""
    enc = encoding.strip().lower()
    if enc in ("", "identity", "none"):
        if len(raw) > limit:
            raise BodyTooLarge
        return raw
    if not raw:
        return b""
    try:
        if enc in ("gzip", "x-gzip"):
            return _inflate_zlib(raw, 47, limit)  # gzip or zlib header, as mitmproxy
        if enc in ("deflate", "deflateraw"):
            try:
                return _inflate_zlib(raw, 15, limit)
            except zlib.error:
                return _inflate_zlib(raw, -15, limit)  # raw deflate without the zlib header
        if enc == "br":
            return _inflate_brotli(raw, limit)
        if enc == "zstd":
            return _inflate_zstd(raw, limit)
    except BodyTooLarge:
        raise
    except Exception as exc:  # zlib.error, brotli.error, zstandard.ZstdError
        raise ValueError(f"{enc} body does not decode") from exc
    raise Unsupported(enc)
