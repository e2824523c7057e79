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

A big body (from `BIG_INPUT_BYTES`) is parsed lazily: simdjson's lazy parser validates and indexes it, the members
beside `input` are built, and `input` is a `LazyItems` (proxy/items/lazyitems.py) whose items are built only
when a stage reads them. The stages that read no more than a big input's length, first and last items and
per-item facts read `ResponsesBody.view`; any other reader gets `ResponsesBody.value`, where the list is built
(once, in place). On an ordinary request of a known session with the default features, no stage builds the list:
the body writer sends the client's own bytes of it around the members a stage changed (web search adds a tool),
and the journal reads a resend on the same bytes (`proxy/items/jsonspan.py` finds them; session 7 did this
for bodies that were still built). Measured in docs/benchmarks.md, session 8.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import fastsimdjson
import orjson
from mitmproxy import http

from proxy import debuglog, errors, gcpause, memory
from proxy.host import clientecho, rawheaders
from proxy.host.addonlookup import find_addon
from proxy.host.flowstate import state_of
from proxy.items.bounded import BodyTooLarge, decode_bounded
from proxy.items.inputs import InputFacts, input_facts
from proxy.items.jsonspan import member_span, strip_ws
from proxy.items.lazyitems import LazyItems, plain

log = logging.getLogger("ctproxy.body")

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
LIMIT_COUNTS: dict[str, int] = {"passthrough": 0, "refused": 0}  # this process, since start
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
    view: dict[str, Any]  # the body as the stages left it; a big body's `input` may be a LazyItems (not built yet)
    changed: bool = False
    source_bytes: int = 0  # the client's body as parsed (decoded): its size, without serializing it again
    _facts: tuple[Sequence[Any], InputFacts] | None = field(default=None, repr=False, compare=False)
    # Called once, when the body writer has written the final body (the bridge sends its first round then).
    on_commit: Callable[[], None] | None = field(default=None, repr=False, compare=False)
    source: bytes = field(default=b"", repr=False, compare=False)  # the client's body as parsed (decoded)
    parsed_input: Any = field(default=None, repr=False, compare=False)  # `input` as parsed (stages never change it)
    parsed_keys: tuple[str, ...] = field(default=(), repr=False, compare=False)  # the members as parsed, in order
    _input_span: tuple[tuple[int, int] | None] | None = field(default=None, repr=False, compare=False)
    # the client's tools, tool_choice, include and instructions as parsed: what its answer must show again
    client_fields: clientecho.Recorded | None = field(default=None, repr=False, compare=False)

    @property
    def value(self) -> dict[str, Any]:
        """The body with its `input` a list: a big body's items are built here, once, for a stage that reads the
        history itself (the stages that read only what `LazyItems` answers cheaply use `view`)."""
        view = self.view
        inp = view.get("input")
        if isinstance(inp, LazyItems):
            view["input"] = inp.materialize()  # the chain's own dict; the list is the same value, built
        return view

    def is_client_input(self, items: Any) -> bool:
        """`items` is the client's `input` list as parsed (lazy or built), which no stage has replaced."""
        parsed = self.parsed_input
        return items is parsed or (isinstance(parsed, LazyItems) and items is parsed.materialized
                                   and items is not None)

    def input_span(self) -> tuple[int, int] | None:
        """Where the client's own bytes of its `input` list (`parsed_input`) are in `source`, when the body is big
        enough to be worth it and they can be found with certainty (`proxy/items/jsonspan.py`), checked
        against the first and last parsed items as orjson writes them (so a client that writes spaces gets None,
        and so does a body with `input` twice, unless both lists begin alike: then the span holds the client's
        bytes of both members, which go on as it sent them); else None. Found once. A lazy body's span was
        found when it was parsed (the items were never built: the client's bytes are the list)."""
        if self._input_span is None:
            items = self.parsed_input
            found = None
            if isinstance(items, list) and len(self.source) >= BIG_INPUT_BYTES:
                found = _client_input_span(self.source, self.parsed_keys, items)
            self._input_span = (found,)
        return self._input_span[0]

    def client_input(self) -> memoryview | None:
        """The client's own bytes of its `input` list (see `input_span`), without copying them."""
        span = self.input_span()
        return memoryview(self.source)[span[0]:span[1]] if span is not None else None

    def replace(self, new: dict[str, Any]) -> None:
        """Adopt a transform's result; a transform that did not apply returns the same object."""
        if new is not self.view:
            self.view = new
            self.changed = True

    def facts(self, items: Sequence[Any]) -> InputFacts:
        """`input_facts(items)`, computed once per input list (the stages ask in turn, of the same list)."""
        cached = self._facts
        if cached is not None and (cached[0] is items or (isinstance(cached[0], LazyItems)
                                                          and cached[0].materialized is items)):
            return cached[1]
        facts = input_facts(items)
        self._facts = (items, facts)
        return facts


BIG_INPUT_BYTES = 64 * 1024  # below this, serializing the input again costs less than finding its bytes


def _client_input_span(raw: bytes, keys: Sequence[str], items: list[Any]) -> tuple[int, int] | None:
    span = member_span(raw, keys, "input")
    if span is None:
        return None
    start, end = span
    if raw[start] != 0x5B or raw[end - 1] != 0x5D:  # '[' … ']'
        return None
    inner_start, inner_end = strip_ws(raw, start + 1, end - 1)
    if not items:
        return span if inner_start == inner_end else None
    try:
        first, last = orjson.dumps(items[0]), orjson.dumps(items[-1])
    except orjson.JSONEncodeError:
        return None
    if raw[inner_start:inner_start + len(first)] != first or raw[inner_end - len(last):inner_end] != last:
        return None  # written otherwise than orjson would (spaces), or not the list that was parsed
    return span


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
    ctype, encoding = rawheaders.values(flow.request.headers.fields, b"content-type", b"content-encoding")
    if ctype and "json" not in ctype.lower():
        return None
    raw = flow.request.raw_content
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
    content = content or b""
    lazy = None
    try:
        lazy = _parse_lazy(content) if len(content) >= BIG_INPUT_BYTES else None
        value = fastsimdjson.loads(content) if lazy is None else lazy[0]
    except (ValueError, RecursionError):  # JSONDecodeError, invalid UTF-8; a nesting json's fallback cannot read
        return None
    finally:
        if len(content) >= memory.BIG_BYTES:
            # simdjson keeps its parser sized for the biggest body it read: released once this body's document
            # is gone (the lazy list holds it), and the heap trimmed (proxy/memory.py)
            memory.note_big_parse(lazy[0].get("input") if lazy is not None else None, len(content))
    if not isinstance(value, dict):
        return None
    st.body = ResponsesBody(value, source_bytes=len(content), source=content, parsed_input=value.get("input"),
                            parsed_keys=tuple(value), _input_span=(lazy[1],) if lazy is not None else None,
                            client_fields=clientecho.recorded(value))
    return st.body


def _parse_lazy(content: bytes) -> tuple[dict[str, Any], tuple[int, int]] | None:
    """A big body as a dict whose `input` is a `LazyItems` over simdjson's lazy document, and where the client's
    bytes of that list are; None when the body is not that shape (the caller parses it whole). The document is
    validated whole here: a body that is not JSON raises as `loads` would."""
    doc = fastsimdjson.parse(content)
    if not isinstance(doc, fastsimdjson.Object):
        return None  # another root, or a body simdjson refused and `json` read (then it was parsed whole)
    keys = list(doc.keys())
    if len(set(keys)) != len(keys) or "input" not in keys:
        return None  # a repeated key: built whole, where the last of each counts (as `loads` reads it)
    items = doc["input"]
    if not isinstance(items, fastsimdjson.Array):
        return None
    span = member_span(content, keys, "input")
    if span is None or content[span[0]] != 0x5B or content[span[1] - 1] != 0x5D:  # '[' … ']'
        return None
    value = {k: LazyItems(items, content, *span) if k == "input" else plain(doc[k]) for k in keys}
    return value, span


def commit_body(flow: http.HTTPFlow) -> bool:
    """Serialize once if changed; keeps the request's Content-Encoding. Returns True if written."""
    body = state_of(flow).body
    if not isinstance(body, ResponsesBody) or not body.changed:
        return False
    try:
        content = _serialize(body)
    except orjson.JSONEncodeError:  # a value orjson cannot write (see the module's docstring): never half a body
        log.warning("ctproxy: a changed request body could not be serialized; the client's body was forwarded")
        return False  # (still `changed`: what went on is not the chain's body)
    flow.request.content = content
    body.changed = False
    if body.client_fields is not None:  # what the answer must show of the client's own request (issue 44)
        st = state_of(flow)
        st.echo = clientecho.client_echo(body.client_fields, body.view, bridged=st.bridge_offered > 0)
        if st.echo is not None:  # what ctproxy added, which the client's answer will not show
            debuglog.event("client_echo", restored=",".join(sorted(st.echo.changed)))
    if body.on_commit is not None:
        done, body.on_commit = body.on_commit, None
        done()
    return True


def _serialize(body: ResponsesBody) -> bytes:
    """The body as orjson writes it; a big input no stage replaced goes as the client's own bytes, copied once
    into the new body, so that adding a tool to a 1.5 MB request does not serialize 1.5 MB again."""
    if len(body.source) < BIG_INPUT_BYTES:
        return orjson.dumps(body.value)  # (a small input is written again: cheaper than finding its bytes)
    value = body.view
    items = value.get("input")
    if not body.is_client_input(items) or (raw := body.client_input()) is None:
        return orjson.dumps(body.value)  # (a list not yet built, whose bytes were not found, is built)
    keys = list(value)
    at = keys.index("input")
    before = orjson.dumps({k: value[k] for k in keys[:at]})  # '{…}'
    after = orjson.dumps({k: value[k] for k in keys[at + 1:]})
    head = before[:-1] + (b',"input":' if at else b'"input":')
    tail = b"," + after[1:] if len(after) > 2 else b"}"
    return b"".join((head, raw, tail))


def commit_if_alone(flow: http.HTTPFlow) -> None:
    """An addon loaded alone writes the body back itself; in the chain the body writer does it once."""
    if find_addon("bodywriter") is None and not refuse_if_over_limit(flow):
        commit_body(flow)
