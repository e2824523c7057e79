"""The answer describes the client's request, not ctproxy's (issue 44).

The upstream echoes the request's `tools`, `tool_choice`, `include` and `instructions` in every `Response` object
(a JSON body, and the `response` of each lifecycle event: created, in_progress, completed, …). ctproxy adds to a
request (the hosted web search and its sources, the bridge's specs, a bridged turn's last `tool_choice: "none"`),
so that echo would hand the client tools it never sent. The client's own values are recorded once, when its body is
parsed (`recorded`); the body writer compares them with what it forwards (`client_echo`) and only a flow whose
request ctproxy changed in one of these fields gets a `ClientEcho`. The answer's Response objects are then given
back the client's values (`restore`): of the echoed tools, the upstream's own rendering of the client's tools (it may
fill defaults such as `strict`), without the ones ctproxy added; the client's `tool_choice` and `instructions`; the
echoed `include` without what ctproxy added. `EchoStream` does this on an SSE stream and decodes only the events
that carry a `response` (found by their bytes); every other byte passes as it came.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.items.sse import StreamTap

FIELDS = ("tools", "tool_choice", "include", "instructions")
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()
Recorded = tuple[Any, Any, Any, Any]  # the client's values of FIELDS, MISSING where it sent none


def recorded(body: Mapping[str, Any]) -> Recorded:
    """The client's values of FIELDS as parsed (lists copied: a stage's transform never edits them, but a copy
    makes sure of it for four small members)."""
    out = []
    for name in FIELDS:
        value = body.get(name, MISSING)
        out.append(list(value) if isinstance(value, list) else value)
    return tuple(out)  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class ClientEcho:
    """What the answer must show of the client's request: the client's value of each field ctproxy changed."""

    changed: frozenset[str]
    tools: Any
    tool_choice: Any
    instructions: Any
    added_include: frozenset[str]


def client_echo(client: Recorded, forwarded: Mapping[str, Any], *, bridged: bool = False) -> ClientEcho | None:
    """None when the forwarded request has the client's own value of every field (the answer is left alone);
    a bridged turn may change `tools` and `tool_choice` in later rounds, so both are restored for it."""
    changed = {name for name, value in zip(FIELDS, client, strict=True) if forwarded.get(name, MISSING) != value}
    if bridged:
        changed |= {"tools", "tool_choice"}
    if not changed:
        return None
    tools, tool_choice, include, instructions = client
    sent = forwarded.get("include")
    own = set(include) if isinstance(include, list) else set()
    added = frozenset(i for i in sent if isinstance(i, str) and i not in own) if isinstance(sent, list) else frozenset()
    return ClientEcho(frozenset(changed), tools, tool_choice, instructions, added)


def _tool_key(tool: Any) -> tuple[Any, ...]:
    if not isinstance(tool, Mapping):
        return ("", repr(tool))
    name = tool.get("name", tool.get("server_label"))
    return (tool.get("type"), name if isinstance(name, str) else None)


def _client_tools(echoed: list[Any], client: Any) -> list[Any]:
    """The upstream's rendering of the client's tools (the echoed ones whose type and name the client sent, in the
    echo's order), or the client's own list when the echo does not hold each of them exactly once."""
    own = client if isinstance(client, list) else []
    want = Counter(_tool_key(t) for t in own)
    kept = []
    for tool in echoed:
        key = _tool_key(tool)
        if want[key] > 0:
            want[key] -= 1
            kept.append(tool)
    return kept if len(kept) == len(own) else list(own)


def restore(resp: dict[str, Any], echo: ClientEcho) -> bool:
    """Give a Response object back the client's values, in place; whether anything changed. A field the object
    does not have stays absent."""
    changed = False
    if "tools" in echo.changed and isinstance(resp.get("tools"), list):
        tools = _client_tools(resp["tools"], echo.tools)
        if tools != resp["tools"]:
            resp["tools"], changed = tools, True
    if "tool_choice" in echo.changed and "tool_choice" in resp:
        want = "auto" if echo.tool_choice is MISSING or echo.tool_choice is None else echo.tool_choice
        if resp["tool_choice"] != want:
            resp["tool_choice"], changed = want, True
    if "include" in echo.changed and isinstance(resp.get("include"), list) and echo.added_include:
        include = [i for i in resp["include"] if i not in echo.added_include]
        if len(include) != len(resp["include"]):
            resp["include"], changed = include, True
    if "instructions" in echo.changed and "instructions" in resp:
        want = None if echo.instructions is MISSING else echo.instructions
        if resp["instructions"] != want:
            resp["instructions"], changed = want, True
    return changed


def restore_json(content: bytes, echo: ClientEcho) -> bytes | None:
    """A JSON answer with the client's values; None when it is not a Response or needs no change."""
    try:
        body = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    if isinstance(body, dict) and body.get("object") == "response" and restore(body, echo):
        return orjson.dumps(body)
    return None


_MARK = b'"response"'  # every event that carries a Response has this key; a JSON string never holds it unescaped
_SEPARATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


def _last_boundary(buf: bytes) -> int:
    """Where the last whole event of `buf` ends (after its blank line), or -1."""
    return max(buf.rfind(sep) + len(sep) if sep in buf else -1 for sep in _SEPARATORS)


def _split(whole: bytes) -> list[bytes]:
    """`whole` (ending on a blank line) cut into events, each with its own blank line."""
    out: list[bytes] = []
    start = 0
    while start < len(whole):
        ends = [(i, sep) for sep in _SEPARATORS if (i := whole.find(sep, start)) >= 0]
        if not ends:
            out.append(whole[start:])
            break
        i, sep = min(ends, key=lambda e: (e[0], -len(e[1])))
        out.append(whole[start:i + len(sep)])
        start = i + len(sep)
    return out


def _rewrite_event(raw: bytes, echo: ClientEcho) -> bytes:
    """One event's bytes, its Response restored; the same bytes when it carries none or needs no change."""
    if _MARK not in raw:
        return raw
    body = raw.rstrip(b"\r\n")
    name: bytes | None = None
    data: list[bytes] = []
    other: list[bytes] = []
    for line in body.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"):
        if line.startswith(b"data:"):
            data.append(line[6:] if line[5:6] == b" " else line[5:])
        elif line.startswith(b"event:"):
            name = line[7:] if line[6:7] == b" " else line[6:]
        else:
            other.append(line)  # id:, retry:, comments: kept
    try:
        payload = orjson.loads(b"\n".join(data))
    except orjson.JSONDecodeError:
        return raw
    if not (isinstance(payload, dict) and isinstance(payload.get("response"), dict)
            and str(payload.get("type", "")).startswith("response.") and restore(payload["response"], echo)):
        return raw
    head = b"".join(line + b"\n" for line in other)
    if name is not None:
        head = b"event: " + name + b"\n" + head
    return head + b"data: " + orjson.dumps(payload) + b"\n\n"


def restore_sse(content: bytes, echo: ClientEcho) -> bytes:
    """A whole buffered SSE answer with the client's values in its lifecycle events."""
    if _MARK not in content:
        return content
    cut = _last_boundary(content)
    events = _split(content[:cut]) if cut > 0 else []
    out = b"".join(_rewrite_event(e, echo) for e in events)
    return out + (content[cut:] if cut > 0 else content)


class EchoStream:
    """A response stream filter: each chunk in, what to send now out (a list, empty while an event is still
    incomplete: an empty bytes chunk would end a chunked body). Chunks that hold only whole events without a
    Response (the deltas, nearly all of a stream) pass as they came, without being parsed; an event is held back
    only until its blank line arrives."""

    __slots__ = ("_echo", "decode", "pending")

    def __init__(self, echo: ClientEcho, decode: Callable[[bytes], bytes] | None = None):
        self._echo = echo
        self.pending = b""  # the start of an event not yet whole
        self.decode = decode  # a compressed answer is passed on decoded (its Content-Encoding header dropped)

    def __call__(self, chunk: bytes) -> list[bytes]:
        if chunk and self.decode is not None:
            chunk = self.decode(chunk)
            if not chunk:
                return []
        if not chunk:  # the end: what is left (an event without its blank line) goes as it came
            rest, self.pending = self.pending, b""
            return [rest] if rest else []
        if not self.pending and chunk[-2:] == b"\n\n" and _MARK not in chunk:
            return [chunk]
        buf = self.pending + chunk if self.pending else chunk
        cut = _last_boundary(buf)
        if cut < 0:
            self.pending = buf
            return []
        whole, self.pending = buf[:cut], buf[cut:]
        if _MARK not in whole:
            return [whole]
        out = b"".join(_rewrite_event(e, self._echo) for e in _split(whole))
        return [out]


class EchoTap(StreamTap):
    """The stream tap of an answer that must show the client's request: each chunk goes through `EchoStream`
    first, and the tap reads, counts and passes on what it gives (a list, empty while it holds an event back).
    The usual chunk (whole events without a Response) takes the tap's own path, one check more."""

    def __init__(self, tap: Any, rewrite: EchoStream, on_end: Callable[[], None] | None = None):
        super().__init__(tap, "", on_end)  # the rewriter decodes a compressed stream itself
        self.rewrite = rewrite

    def __call__(self, chunk: bytes) -> bytes | list[bytes]:
        rewrite = self.rewrite
        if chunk[-2:] == b"\n\n" and not rewrite.pending and rewrite.decode is None and _MARK not in chunk:
            return StreamTap.__call__(self, chunk)  # whole events without a Response: as they came
        out = rewrite(chunk)
        for piece in out:
            StreamTap.__call__(self, piece)
        if not chunk:
            StreamTap.__call__(self, b"")  # the end
        return out
