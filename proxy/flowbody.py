"""The body codec: a Responses request body is parsed at most once and serialized at most once
per flow, only when something changed. Non-JSON and unparseable bodies are left untouched.

Bodies are read within `limits.max_body_bytes` (docs/pipeline.md, "Limits"): a plain body above it is
not parsed (the request passes through untouched, features skipped); a compressed body is inflated
with a bounded decoder (gzip/deflate, br, zstd, the encodings mitmproxy decodes), and one that inflates
past the limit is a decompression bomb: not parsed, and the body writer answers it with a 413.
Both cases are counted (`LIMIT_COUNTS`) and logged with one line holding sizes only.

The parse is simdjson's (`fastsimdjson.loads`, the simdjson project's own binding): the same values as
`orjson.loads` for every RFC 8259 document, in ≈60% of its time (0.67 against 1.10 ms on bench b's 1.5 MB,
7.0 against 9.8 µs on 10 KB; docs/benchmarks.md, session 6). Where simdjson refuses a document it reads it as
Python's `json` module does, so a few bodies orjson refused are now parsed: NaN/Infinity, a lone surrogate, a
UTF-8 byte-order mark, integers beyond 64 bits (which orjson read as floats). A body the chain changes is still
written by orjson; one orjson cannot write (a lone surrogate, an integer beyond 64 bits) goes on exactly as the
client sent it (`commit_body`).
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastsimdjson
import orjson
from mitmproxy import http

from proxy import errors, gcpause
from proxy.addonlookup import find_addon
from proxy.flowstate import state_of
from proxy.transforms.items import InputFacts, input_facts

log = logging.getLogger("ctproxy.body")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
LIMIT_COUNTS: dict[str, int] = {"passthrough": 0, "refused": 0}  # this process, since start
_CHUNK = 64 * 1024  # compressed input fed per step
_STEP = 1024 * 1024  # output produced per step: a bomb's peak memory stays near the limit, not twice it


class BodyTooLarge(ValueError):
    """The decoded body would exceed the limit."""


class _Unsupported(ValueError):
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
    ValueError when it does not decode, _Unsupported for an encoding mitmproxy would not decode."""
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
    raise _Unsupported(enc)


_max_body_bytes = DEFAULT_MAX_BODY_BYTES


def set_max_body_bytes(limit: int) -> None:
    """`limits.max_body_bytes`, pushed by the stages when they take their runtime (addons/_stage.py)."""
    global _max_body_bytes
    _max_body_bytes = limit


def max_body_bytes() -> int:
    return _max_body_bytes


def _over_limit(flow: http.HTTPFlow, outcome: str, encoding: str, sent: int, limit: int) -> None:
    state_of(flow).body_limit = outcome
    LIMIT_COUNTS[outcome] += 1
    if outcome == "refused":
        log.warning("ctproxy: a %d-byte %s request body inflates past limits.max_body_bytes (%d); refused with 413",
                    sent, encoding, limit)
    else:
        log.warning("ctproxy: a %d-byte request body is above limits.max_body_bytes (%d); passed through "
                    "untouched, features skipped", sent, limit)


def refuse_if_over_limit(flow: http.HTTPFlow) -> bool:
    """In the request phase: answer a body that inflated past the limit with a 413 instead of forwarding it."""
    st = state_of(flow)
    if st.body_limit != "refused" or flow.response is not None:
        return False
    info = st.body_limit_info or (0, "", 0)
    flow.response = errors.json_response(errors.body_too_large(*info))
    return True


@dataclass
class ResponsesBody:
    value: dict[str, Any]
    changed: bool = False
    source_bytes: int = 0  # the client's body as parsed (decoded): its size, without serializing it again
    _facts: tuple[Sequence[Any], InputFacts] | None = field(default=None, repr=False, compare=False)
    # Called once, when the body writer has written the final body (the bridge sends its first round then).
    on_commit: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def replace(self, new: dict[str, Any]) -> None:
        """Adopt a transform's result; a transform that did not apply returns the same object."""
        if new is not self.value:
            self.value = new
            self.changed = True

    def facts(self, items: Sequence[Any]) -> InputFacts:
        """`input_facts(items)`, computed once per input list (the stages ask in turn, of the same list)."""
        cached = self._facts
        if cached is not None and cached[0] is items:
            return cached[1]
        facts = input_facts(items)
        self._facts = (items, facts)
        return facts


def request_path(flow: http.HTTPFlow) -> str:
    return flow.request.path.split("?", 1)[0]


def is_responses_create(flow: http.HTTPFlow) -> bool:
    """POST …/v1/responses or …/backend-api/codex/responses (not /compact, /input_tokens, …)."""
    if flow.request.method != "POST":
        return False
    path = request_path(flow).rstrip("/")
    return path.endswith("/v1/responses") or path.endswith("/backend-api/codex/responses")


def is_compact(flow: http.HTTPFlow) -> bool:
    return flow.request.method == "POST" and request_path(flow).rstrip("/").endswith("/responses/compact")


def responses_body(flow: http.HTTPFlow) -> ResponsesBody | None:
    """The parsed JSON object of a Responses create request, parsed once per flow."""
    st = state_of(flow)
    if st.body_checked:
        return st.body
    st.body_checked = True
    if not is_responses_create(flow) or flow.request.raw_content is None:
        return None
    ctype = flow.request.headers.get("content-type", "")
    if ctype and "json" not in ctype.lower():
        return None
    raw = flow.request.raw_content
    encoding = flow.request.headers.get("content-encoding", "")
    limit = max_body_bytes()
    try:
        content = decode_bounded(raw, encoding, limit)
    except BodyTooLarge:
        if encoding.strip().lower() in ("", "identity", "none"):
            _over_limit(flow, "passthrough", "identity", len(raw), limit)
        else:
            state_of(flow).body_limit_info = (limit, encoding.strip().lower(), len(raw))
            _over_limit(flow, "refused", encoding.strip().lower(), len(raw), limit)
        return None
    except ValueError:
        return None  # undecodable or an unknown encoding: untouched, as before
    if st.gc_hold is None:  # before the parse: its allocations must not start a collection (proxy/gcpause.py)
        st.gc_hold = gcpause.hold_for(st, len(content or b""))
    try:
        value = fastsimdjson.loads(content or b"")
    except (ValueError, RecursionError):  # JSONDecodeError, invalid UTF-8; a nesting json's fallback cannot read
        return None
    if not isinstance(value, dict):
        return None
    st.body = ResponsesBody(value, source_bytes=len(content or b""))
    return st.body


def commit_body(flow: http.HTTPFlow) -> bool:
    """Serialize once if changed; keeps the request's Content-Encoding. Returns True if written."""
    body = state_of(flow).body
    if not isinstance(body, ResponsesBody) or not body.changed:
        return False
    try:
        content = orjson.dumps(body.value)
    except orjson.JSONEncodeError:  # a value orjson cannot write (see the module's docstring): never half a body
        log.warning("ctproxy: a changed request body could not be serialized; the client's body was forwarded")
        return False  # (still `changed`: what went on is not the chain's body)
    flow.request.content = content
    body.changed = False
    if body.on_commit is not None:
        done, body.on_commit = body.on_commit, None
        done()
    return True


def commit_if_alone(flow: http.HTTPFlow) -> None:
    """An addon loaded alone writes the body back itself; in the chain the body writer does it once."""
    if find_addon("bodywriter") is None and not refuse_if_over_limit(flow):
        commit_body(flow)
