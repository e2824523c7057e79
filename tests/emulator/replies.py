"""The scripting API: small dataclasses that say what the emulator answers next.

An output item (`Text`, `FunctionCall`, `CustomToolCall`, `WebSearch`, `Reasoning`, `Compaction`,
`Item`) is a reply by itself, or one part of a `Response(items=[...])`. Every reply takes the
keyword options of `ReplyOptions` (usage override, delays, disconnects, headers); inside a
`Response` only the `Response` itself may carry them.

    emu.script(Text("hello", deltas=5))
    emu.script(Response([Reasoning(summary="plan"), FunctionCall("get_weather", {"city": "Paris"})],
                        usage={"input_tokens": 250_000}))
    emu.script(FailedInStream(), context_length_exceeded_400(), Text("ok", pause_after_first=2.0))
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

import orjson

from .wire import CONTEXT_LENGTH_MESSAGE, ERROR_MESSAGES, error_body

if TYPE_CHECKING:
    from .recording import ReceivedRequest


@dataclass(kw_only=True)
class ReplyOptions:
    """Options every reply understands.

    usage: partial `ResponseUsage` merged over the estimate (`total_tokens` follows unless given).
    delays: `{event_index: seconds}` — sleep after writing that (0-based) SSE event.
    pause_after_first: shorthand for `delays={0: seconds}`.
    disconnect_after: write this many events, then close the connection with no terminal event.
    latency: seconds to wait before the status line is sent.
    headers: extra response headers.
    stall_after: write this many SSE events (0: headers only), then send nothing more and keep the
        connection open until the client closes it (recorded as `client_disconnected`).
    stall_before_headers: send nothing at all (not even the status line) until the client closes.
    """

    usage: Mapping[str, Any] | None = None
    delays: Mapping[int, float] | None = None
    pause_after_first: float | None = None
    disconnect_after: int | None = None
    latency: float = 0.0
    headers: Mapping[str, str] | None = None
    stall_after: int | None = None
    stall_before_headers: bool = False

    def options_set(self) -> list[str]:
        """Names of the options that differ from their defaults."""
        names = [f.name for f in fields(ReplyOptions)]
        defaults = ReplyOptions()
        return [n for n in names if getattr(self, n) != getattr(defaults, n)]

    def event_delays(self) -> dict[int, float]:
        out = dict(self.delays or {})
        if self.pause_after_first is not None:
            out[0] = out.get(0, 0.0) + self.pause_after_first
        return out


# ---- output items ------------------------------------------------------------------------------


@dataclass
class Text(ReplyOptions):
    """An assistant message with one `output_text` part, streamed in `deltas` pieces."""

    text: str
    deltas: int = 3
    annotations: Sequence[Mapping[str, Any]] = ()
    phase: Literal["commentary", "final_answer"] | None = None


@dataclass
class FunctionCall(ReplyOptions):
    """A `function_call` item; `arguments` may be a JSON string or a mapping (serialised compactly)."""

    name: str
    arguments: str | Mapping[str, Any] = "{}"
    call_id: str | None = None
    namespace: str | None = None
    deltas: int = 2

    @property
    def arguments_json(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return orjson.dumps(dict(self.arguments)).decode()


@dataclass
class CustomToolCall(ReplyOptions):
    """A `custom_tool_call` item (freeform tools such as a grammar-constrained `apply_patch`)."""

    name: str
    input: str
    call_id: str | None = None
    namespace: str | None = None
    deltas: int = 2


@dataclass
class WebSearch(ReplyOptions):
    """A `web_search_call` item, then (unless `answer == ""`) a message citing the sources.

    sources: URLs, or mappings with `url` and optional `title`. They appear in
    `action.sources` only when the request asked `include: ["web_search_call.action.sources"]`;
    the message always cites them with `url_citation` annotations.
    """

    query: str
    sources: Sequence[str | Mapping[str, str]] = ()
    answer: str | None = None
    deltas: int = 3


@dataclass
class Reasoning(ReplyOptions):
    """A `reasoning` item. `encrypted_content=None` derives an opaque blob from the request."""

    summary: str | Sequence[str] = ()
    encrypted_content: str | None = None
    tokens: int | None = None  # reasoning tokens reported in usage; estimated when None

    @property
    def summaries(self) -> list[str]:
        return [self.summary] if isinstance(self.summary, str) else list(self.summary)


@dataclass
class Compaction(ReplyOptions):
    """One `compaction` item. `encrypted_content=None` is deterministic per request input."""

    encrypted_content: str | None = None


@dataclass
class Item(ReplyOptions):
    """Any output item, emitted verbatim in `output_item.added` and `.done`."""

    item: Mapping[str, Any]


OutputItem = Text | FunctionCall | CustomToolCall | WebSearch | Reasoning | Compaction | Item


# ---- whole replies -----------------------------------------------------------------------------


@dataclass
class Response(ReplyOptions):
    """A 200 answer made of output items; `status="incomplete"` ends with `response.incomplete`."""

    items: Sequence[OutputItem] = ()
    status: Literal["completed", "incomplete"] = "completed"
    incomplete_reason: Literal["max_output_tokens", "content_filter"] = "max_output_tokens"

    def __post_init__(self) -> None:
        for item in self.items:
            if not isinstance(item, OutputItem):
                raise TypeError(f"Response items must be output items, not {type(item).__name__}")
            if item.options_set():
                raise ValueError(
                    f"set {', '.join(item.options_set())} on the Response, not on its {type(item).__name__}"
                )


@dataclass
class FailedInStream(ReplyOptions):
    """A 200 stream: `response.created`, any partial `items`, then `response.failed`.

    Non-streaming requests get the failed `Response` object as JSON (HTTP 200).
    """

    code: str = "context_length_exceeded"
    message: str | None = None
    items: Sequence[OutputItem] = ()

    @property
    def error_message(self) -> str:
        return self.message or ERROR_MESSAGES.get(self.code, ERROR_MESSAGES["server_error"])


@dataclass
class ErrorEvent(ReplyOptions):
    """A 200 stream: `response.created`, `response.in_progress`, then an `error` event.

    nested=True is the shape seen in the wild (`{"type":"error","error":{...}}`, which the SDK
    raises as `APIError`); nested=False is the spec's flat `ResponseErrorEvent`.
    Non-streaming requests get `http_status` with the same error as an `ErrorResponse`.
    """

    code: str | None = "context_length_exceeded"
    message: str | None = None
    param: str | None = None  # None means "input" for context_length_exceeded
    error_type: str = "invalid_request_error"
    nested: bool = True
    http_status: int = 400

    @property
    def error_message(self) -> str:
        return self.message or ERROR_MESSAGES.get(self.code or "", ERROR_MESSAGES["server_error"])

    @property
    def error_param(self) -> str | None:
        if self.param is None and self.code == "context_length_exceeded":
            return "input"
        return self.param


@dataclass
class HttpError(ReplyOptions):
    """A non-2xx answer with a JSON (mapping) or verbatim (bytes/str) body."""

    status: int = 500
    body: Mapping[str, Any] | bytes | str = field(
        default_factory=lambda: error_body(ERROR_MESSAGES["server_error"], "server_error")
    )


@dataclass
class Raw:
    """Exact body bytes and headers (aiohttp still adds Date, Server and the framing header).

    `body` as a list of chunks streams them one write each; `delays` and `disconnect_after`
    count chunks.
    """

    status: int = 200
    headers: Sequence[tuple[str, str]] | Mapping[str, str] = ()
    body: bytes | Sequence[bytes] = b""
    delays: Mapping[int, float] | None = None
    disconnect_after: int | None = None
    latency: float = 0.0


Reply = Response | OutputItem | FailedInStream | ErrorEvent | HttpError | Raw
Responder = Reply | Callable[["ReceivedRequest"], Reply]


def context_length_exceeded_400() -> HttpError:
    """The exact body the API returns when the input is too long (responses-api.md §5.2 form 1)."""
    return HttpError(
        400, error_body(CONTEXT_LENGTH_MESSAGE, "invalid_request_error", "input", "context_length_exceeded")
    )


def rate_limited_429(retry_after: float = 1.0, *, code: str = "rate_limit_exceeded") -> HttpError:
    """429 with `retry-after` (seconds) and `retry-after-ms`, like the real rate limiter."""
    if code == "insufficient_quota":
        body = error_body(ERROR_MESSAGES["insufficient_quota"], "insufficient_quota", None, code)
    else:
        msg = ERROR_MESSAGES["rate_limit_exceeded"].replace("11.054s", f"{retry_after:g}s")
        body = error_body(msg, "tokens", None, code)
    secs = max(0, round(retry_after))
    return HttpError(
        429,
        body,
        headers={
            "retry-after": str(secs),
            "retry-after-ms": str(int(retry_after * 1000)),
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": f"{retry_after:g}s",
        },
    )


def insufficient_quota_429() -> HttpError:
    return rate_limited_429(0, code="insufficient_quota")


def server_error_500() -> HttpError:
    return HttpError(500, error_body(ERROR_MESSAGES["server_error"], "server_error"))
