"""Turn a reply into a `Plan`: the exact status, headers and body or SSE frames to send.

Pure: no sockets, no sleeping. The app executes plans; tests can render without a server.
Event order and fields follow the real stream (responses-api.md §4): created → in_progress →
per item (output_item.added, its part/delta/done events, output_item.done) → completed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import orjson

from .compaction import compaction_blob
from .replies import (
    Compaction,
    CustomToolCall,
    ErrorEvent,
    FailedInStream,
    FunctionCall,
    HttpError,
    Item,
    OutputItem,
    Raw,
    Reasoning,
    Reply,
    ReplyOptions,
    Response,
    Text,
    WebSearch,
)
from .wire import (
    approx_tokens,
    canonical_hash,
    error_body,
    make_usage,
    merge_usage,
    new_call_id,
    new_id,
    new_request_id,
    opaque_blob,
    request_input,
    response_object,
)

SOURCES_INCLUDE = "web_search_call.action.sources"
_NO_OPTIONS = ReplyOptions()
_OBFUSCATION_ALPHABET = "aZ3kQ9xL0pW7mN2bV5cT8rY1hG4jF6dS" * 2


@dataclass
class RenderContext:
    """What rendering needs to know about the request being answered."""

    body: Mapping[str, Any]
    input_tokens: int
    stream: bool
    created_at: int = field(default_factory=lambda: int(time.time()))
    response_id: str = field(default_factory=lambda: new_id("resp"))
    # the prompt cache's answer (cache.py): usage.input_tokens_details and Response.input_transformations
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    input_transformations: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def for_request(cls, body: Mapping[str, Any], input_tokens: int) -> RenderContext:
        return cls(body=body, input_tokens=input_tokens, stream=body.get("stream") is True)

    @property
    def include(self) -> frozenset[str]:
        inc = self.body.get("include")
        return frozenset(i for i in inc if isinstance(i, str)) if isinstance(inc, list) else frozenset()

    @property
    def obfuscate(self) -> bool:
        opts = self.body.get("stream_options")
        return not (isinstance(opts, Mapping) and opts.get("include_obfuscation") is False)

    @cached_property
    def seed(self) -> bytes:
        """A digest of the request input (without a trailing compaction trigger)."""
        items = request_input(self.body)
        if items and isinstance(items[-1], dict) and items[-1].get("type") == "compaction_trigger":
            items = items[:-1]
        return canonical_hash(items)


@dataclass
class Plan:
    """What to send. Exactly one of `body` (one-shot) or `chunks` (streamed writes) is set."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes | None = None
    chunks: list[bytes] | None = None
    events: list[dict[str, Any]] = field(default_factory=list)  # the decoded SSE events, if any
    delays: dict[int, float] = field(default_factory=dict)
    disconnect_after: int | None = None
    latency: float = 0.0
    response: dict[str, Any] | None = None  # the final Response object (for the retrieve store)
    stall_after: int | None = None  # chunks written before the stream goes silent until the client leaves
    stall_before_headers: bool = False  # silent from the start until the client leaves

    @property
    def response_id(self) -> str | None:
        return self.response["id"] if self.response else None


def encode_frame(event: Mapping[str, Any]) -> bytes:
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def split_text(text: str, n: int) -> list[str]:
    """`n` nearly equal non-empty pieces (fewer when the text is shorter); [] for ''."""
    if not text:
        return []
    n = max(1, min(n, len(text)))
    size, extra = divmod(len(text), n)
    out, pos = [], 0
    for i in range(n):
        step = size + (1 if i < extra else 0)
        out.append(text[pos : pos + step])
        pos += step
    return out


def _base_headers(content_type: str) -> list[tuple[str, str]]:
    return [
        ("Content-Type", content_type),
        ("x-request-id", new_request_id()),
        ("openai-version", "2020-10-01"),
        ("openai-processing-ms", "42"),
    ]


def _extra_headers(reply_headers: Mapping[str, str] | None) -> list[tuple[str, str]]:
    return [(k, v) for k, v in (reply_headers or {}).items()]


def render(reply: Reply, ctx: RenderContext) -> Plan:
    if isinstance(reply, Raw):
        return _render_raw(reply)
    if isinstance(reply, HttpError):
        return _json_plan(reply.status, reply.body, reply.headers, reply.latency)
    if isinstance(reply, ErrorEvent):
        return _render_error_event(reply, ctx)
    if isinstance(reply, FailedInStream):
        return _render_failed(reply, ctx)
    if isinstance(reply, Response):
        return _render_response(reply, ctx)
    if isinstance(reply, OutputItem):
        # A lone item is a one-item Response; its reply options move to that Response.
        opts = {name: getattr(reply, name) for name in reply.options_set()}
        bare = replace(reply, **{name: getattr(_NO_OPTIONS, name) for name in opts})
        return _render_response(Response(items=[bare], **opts), ctx)
    raise TypeError(f"not a reply: {reply!r}")


# ---- plans -------------------------------------------------------------------------------------


def _json_plan(
    status: int, body: Mapping[str, Any] | bytes | str, headers: Mapping[str, str] | None, latency: float
) -> Plan:
    if isinstance(body, bytes):
        data = body
    elif isinstance(body, str):
        data = body.encode()
    else:
        data = orjson.dumps(body)
    hdrs = _base_headers("application/json") + _extra_headers(headers)
    resp = body if isinstance(body, Mapping) and body.get("object") == "response" else None
    return Plan(status=status, headers=hdrs, body=data, latency=latency, response=resp)  # type: ignore[arg-type]


def _stream_plan(events: list[dict[str, Any]], reply: Any, final: dict[str, Any] | None) -> Plan:
    hdrs = _base_headers("text/event-stream; charset=utf-8") + _extra_headers(reply.headers)
    return Plan(
        status=200,
        headers=hdrs,
        chunks=[encode_frame(e) for e in events],
        events=events,
        delays=reply.event_delays(),
        disconnect_after=reply.disconnect_after,
        latency=reply.latency,
        response=final,
    )


def _render_raw(reply: Raw) -> Plan:
    headers = list(reply.headers.items()) if isinstance(reply.headers, Mapping) else list(reply.headers)
    if isinstance(reply.body, bytes):
        return Plan(status=reply.status, headers=headers, body=reply.body, latency=reply.latency)
    return Plan(
        status=reply.status,
        headers=headers,
        chunks=list(reply.body),
        delays=dict(reply.delays or {}),
        disconnect_after=reply.disconnect_after,
        latency=reply.latency,
    )


class _Events:
    """Collects events, numbering them from 0 in emission order."""

    def __init__(self, obfuscate: bool):
        self.events: list[dict[str, Any]] = []
        self._obfuscate = obfuscate

    def emit(self, type_: str, **payload: Any) -> None:
        self.events.append({"type": type_, "sequence_number": len(self.events), **payload})

    def delta(self, type_: str, delta: str, **payload: Any) -> None:
        if self._obfuscate:
            # The API pads deltas with random characters so lengths do not leak token sizes.
            pad = max(0, 16 - len(delta))
            start = len(self.events) % 32
            payload["obfuscation"] = _OBFUSCATION_ALPHABET[start : start + pad]
        self.emit(type_, delta=delta, **payload)


@dataclass
class _Output:
    items: list[dict[str, Any]] = field(default_factory=list)
    output_tokens: int = 0
    reasoning_tokens: int = 0


def _render_response(reply: Response, ctx: RenderContext) -> Plan:
    ev = _Events(ctx.obfuscate)
    out = _Output()
    _lifecycle_start(ev, ctx)
    for item in reply.items:
        _render_item(item, ev, out, ctx)
    usage = _cached(ctx, merge_usage(_base_usage(ctx, max(1, out.output_tokens) if reply.items else 0,
                                                 out.reasoning_tokens), reply.usage))
    done = reply.status == "completed"
    final = response_object(
        ctx.body,
        response_id=ctx.response_id,
        created_at=ctx.created_at,
        status=reply.status,
        output=out.items,
        usage=usage,
        incomplete_reason=None if done else reply.incomplete_reason,
        completed_at=int(time.time()) if done else None,
    )
    if ctx.input_transformations:
        final["input_transformations"] = list(ctx.input_transformations)
    if not ctx.stream:
        return _json_plan(200, final, reply.headers, reply.latency)
    ev.emit("response.completed" if done else "response.incomplete", response=final)
    return _stream_plan(ev.events, reply, final)


def _base_usage(ctx: RenderContext, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    usage = make_usage(ctx.input_tokens, output_tokens, reasoning_tokens)
    usage["input_tokens_details"] = {"cached_tokens": ctx.cached_tokens, "cache_write_tokens": ctx.cache_write_tokens}
    return usage


def _cached(ctx: RenderContext, usage: dict[str, Any]) -> dict[str, Any]:
    """A scripted `input_tokens` below the cache's hit: the hit is clamped to it (never more cached than sent)."""
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and isinstance(usage.get("input_tokens"), int):
        details["cached_tokens"] = min(details.get("cached_tokens") or 0, usage["input_tokens"])
    return usage


def _render_failed(reply: FailedInStream, ctx: RenderContext) -> Plan:
    ev = _Events(ctx.obfuscate)
    out = _Output()
    ev.emit("response.created", response=_snapshot(ctx, "in_progress"))
    for item in reply.items:
        _render_item(item, ev, out, ctx)
    usage = None
    if reply.usage:
        usage = _cached(ctx, merge_usage(_base_usage(ctx, out.output_tokens, out.reasoning_tokens), reply.usage))
    final = response_object(
        ctx.body,
        response_id=ctx.response_id,
        created_at=ctx.created_at,
        status="failed",
        output=out.items,
        usage=usage,
        error={"code": reply.code, "message": reply.error_message},
    )
    if not ctx.stream:
        return _json_plan(200, final, reply.headers, reply.latency)
    ev.emit("response.failed", response=final)
    return _stream_plan(ev.events, reply, final)


def _render_error_event(reply: ErrorEvent, ctx: RenderContext) -> Plan:
    err = {
        "type": reply.error_type,
        "code": reply.code,
        "message": reply.error_message,
        "param": reply.error_param,
    }
    if not ctx.stream:
        return _json_plan(reply.http_status, {"error": err}, reply.headers, reply.latency)
    ev = _Events(ctx.obfuscate)
    _lifecycle_start(ev, ctx)
    if reply.nested:
        ev.emit("error", error=err)
    else:
        ev.emit("error", code=err["code"], message=err["message"], param=err["param"])
    return _stream_plan(ev.events, reply, None)


def _snapshot(ctx: RenderContext, status: str) -> dict[str, Any]:
    return response_object(
        ctx.body,
        response_id=ctx.response_id,
        created_at=ctx.created_at,
        status=status,
        output=[],
        usage=None,
    )


def _lifecycle_start(ev: _Events, ctx: RenderContext) -> None:
    ev.emit("response.created", response=_snapshot(ctx, "in_progress"))
    ev.emit("response.in_progress", response=_snapshot(ctx, "in_progress"))


# ---- items -------------------------------------------------------------------------------------


def _render_item(item: OutputItem, ev: _Events, out: _Output, ctx: RenderContext) -> None:
    if isinstance(item, Text):
        _message(item.text, item.deltas, list(item.annotations), item.phase, ev, out)
    elif isinstance(item, FunctionCall):
        _function_call(item, ev, out)
    elif isinstance(item, CustomToolCall):
        _custom_tool_call(item, ev, out)
    elif isinstance(item, WebSearch):
        _web_search(item, ev, out, ctx)
    elif isinstance(item, Reasoning):
        _reasoning(item, ev, out, ctx)
    elif isinstance(item, Compaction):
        _compaction(item, ev, out, ctx)
    elif isinstance(item, Item):
        idx = len(out.items)
        data = dict(item.item)
        ev.emit("response.output_item.added", output_index=idx, item=data)
        ev.emit("response.output_item.done", output_index=idx, item=data)
        out.items.append(data)
    else:  # pragma: no cover - guarded by Response.__post_init__
        raise TypeError(f"not an output item: {item!r}")


def _message(
    text: str,
    deltas: int,
    annotations: list[Mapping[str, Any]],
    phase: str | None,
    ev: _Events,
    out: _Output,
) -> None:
    idx, item_id = len(out.items), new_id("msg")
    head: dict[str, Any] = {"id": item_id, "type": "message", "status": "in_progress", "content": []}
    if phase:
        head["phase"] = phase
    head["role"] = "assistant"
    ev.emit("response.output_item.added", output_index=idx, item=head)
    where = {"item_id": item_id, "output_index": idx, "content_index": 0}
    empty_part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    ev.emit("response.content_part.added", **where, part=empty_part)
    pending = sorted(enumerate(annotations), key=lambda pair: int(pair[1].get("end_index", 0)))
    sent = 0
    for piece in split_text(text, deltas):
        ev.delta("response.output_text.delta", piece, **where, logprobs=[])
        sent += len(piece)
        # An annotation is announced once the text it covers has streamed.
        while pending and int(pending[0][1].get("end_index", 0)) <= sent:
            n, ann = pending.pop(0)
            ev.emit("response.output_text.annotation.added", **where, annotation_index=n, annotation=dict(ann))
    for n, ann in pending:
        ev.emit("response.output_text.annotation.added", **where, annotation_index=n, annotation=dict(ann))
    ev.emit("response.output_text.done", **where, text=text, logprobs=[])
    part = {"type": "output_text", "annotations": [dict(a) for a in annotations], "logprobs": [], "text": text}
    ev.emit("response.content_part.done", **where, part=part)
    final = {**head, "status": "completed", "content": [part]}
    ev.emit("response.output_item.done", output_index=idx, item=final)
    out.items.append(final)
    out.output_tokens += approx_tokens(text)


def _function_call(item: FunctionCall, ev: _Events, out: _Output) -> None:
    idx, item_id = len(out.items), new_id("fc")
    args = item.arguments_json
    head: dict[str, Any] = {
        "id": item_id,
        "type": "function_call",
        "status": "in_progress",
        "arguments": "",
        "call_id": item.call_id or new_call_id(),
        "name": item.name,
    }
    if item.namespace:
        head["namespace"] = item.namespace
    ev.emit("response.output_item.added", output_index=idx, item=head)
    for piece in split_text(args, item.deltas):
        ev.delta("response.function_call_arguments.delta", piece, item_id=item_id, output_index=idx)
    ev.emit(
        "response.function_call_arguments.done",
        item_id=item_id,
        name=item.name,
        output_index=idx,
        arguments=args,
    )
    final = {**head, "status": "completed", "arguments": args}
    ev.emit("response.output_item.done", output_index=idx, item=final)
    out.items.append(final)
    out.output_tokens += approx_tokens(item.name + args)


def _custom_tool_call(item: CustomToolCall, ev: _Events, out: _Output) -> None:
    idx, item_id = len(out.items), new_id("ctc")
    head: dict[str, Any] = {
        "id": item_id,
        "type": "custom_tool_call",
        "status": "in_progress",
        "call_id": item.call_id or new_call_id(),
        "input": "",
        "name": item.name,
    }
    if item.namespace:
        head["namespace"] = item.namespace
    ev.emit("response.output_item.added", output_index=idx, item=head)
    for piece in split_text(item.input, item.deltas):
        ev.delta("response.custom_tool_call_input.delta", piece, item_id=item_id, output_index=idx)
    ev.emit("response.custom_tool_call_input.done", item_id=item_id, output_index=idx, input=item.input)
    final = {**head, "status": "completed", "input": item.input}
    ev.emit("response.output_item.done", output_index=idx, item=final)
    out.items.append(final)
    out.output_tokens += approx_tokens(item.name + item.input)


def _source(src: str | Mapping[str, str]) -> tuple[str, str]:
    if isinstance(src, str):
        url, title = src, ""
    else:
        url, title = src["url"], src.get("title", "")
    if not title:
        host = url.split("://", 1)[-1].split("/", 1)[0]
        title = host.removeprefix("www.") or url
    return url, title


def _web_search(item: WebSearch, ev: _Events, out: _Output, ctx: RenderContext) -> None:
    idx, item_id = len(out.items), new_id("ws")
    sources = [_source(s) for s in item.sources]
    head = {"id": item_id, "type": "web_search_call", "status": "in_progress", "action": {"type": "search"}}
    ev.emit("response.output_item.added", output_index=idx, item=head)
    for phase in ("in_progress", "searching", "completed"):
        ev.emit(f"response.web_search_call.{phase}", output_index=idx, item_id=item_id)
    action: dict[str, Any] = {"type": "search", "query": item.query, "queries": [item.query]}
    if SOURCES_INCLUDE in ctx.include:
        action["sources"] = [{"type": "url", "url": url} for url, _ in sources]
    final = {"id": item_id, "type": "web_search_call", "status": "completed", "action": action}
    ev.emit("response.output_item.done", output_index=idx, item=final)
    out.items.append(final)
    if item.answer == "":
        return
    text = item.answer or f"Here is what I found about {item.query}."
    annotations = []
    for url, title in sources:
        text += " "
        start = len(text)
        text += f"([{title}]({url}))"
        annotations.append(
            {"type": "url_citation", "start_index": start, "end_index": len(text), "title": title, "url": url}
        )
    _message(text, item.deltas, annotations, None, ev, out)


def _reasoning(item: Reasoning, ev: _Events, out: _Output, ctx: RenderContext) -> None:
    idx, item_id = len(out.items), new_id("rs")
    blob = item.encrypted_content
    if blob is None:
        blob = opaque_blob(b"reasoning" + ctx.seed + idx.to_bytes(4, "big"))
    # The `.added` copy is incomplete on purpose: clients must take the item from `.done`.
    head = {"id": item_id, "type": "reasoning", "summary": [], "encrypted_content": blob[: len(blob) // 2]}
    ev.emit("response.output_item.added", output_index=idx, item=head)
    summary = []
    for n, text in enumerate(item.summaries):
        where = {"item_id": item_id, "output_index": idx, "summary_index": n}
        ev.emit("response.reasoning_summary_part.added", **where, part={"type": "summary_text", "text": ""})
        for piece in split_text(text, 2):
            ev.delta("response.reasoning_summary_text.delta", piece, **where)
        ev.emit("response.reasoning_summary_text.done", **where, text=text)
        ev.emit("response.reasoning_summary_part.done", **where, part={"type": "summary_text", "text": text})
        summary.append({"type": "summary_text", "text": text})
    final = {"id": item_id, "type": "reasoning", "summary": summary, "encrypted_content": blob}
    ev.emit("response.output_item.done", output_index=idx, item=final)
    out.items.append(final)
    tokens = item.tokens if item.tokens is not None else 16 + approx_tokens("".join(item.summaries))
    out.output_tokens += tokens
    out.reasoning_tokens += tokens


def _compaction(item: Compaction, ev: _Events, out: _Output, ctx: RenderContext) -> None:
    idx = len(out.items)
    blob = item.encrypted_content if item.encrypted_content is not None else compaction_blob(ctx.seed)
    final = {"id": new_id("cmp"), "type": "compaction", "encrypted_content": blob}
    ev.emit("response.output_item.added", output_index=idx, item=final)
    ev.emit("response.output_item.done", output_index=idx, item=final)
    out.items.append(final)
    out.output_tokens += approx_tokens(blob)


def error_plan(status: int, message: str, type_: str, param: str | None = None, code: str | None = None) -> Plan:
    """An `ErrorResponse` answer the emulator itself decides on (bad JSON, unknown URL, …)."""
    return _json_plan(status, error_body(message, type_, param, code), None, 0.0)


def json_plan(body: Mapping[str, Any], status: int = 200) -> Plan:
    return _json_plan(status, body, None, 0.0)
