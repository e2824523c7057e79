"""A faithful OpenAI Responses upstream for tests and benchmarks (aiohttp, loopback).

    from tests.emulator import Emulator, Text, FunctionCall, context_length_exceeded_400

See `app.py` for routes, `replies.py` for the scripting API, `recording.py` for what is recorded.
"""

from .app import Emulator, compaction_reply, echo_reply
from .recording import ReceivedRequest
from .render import Plan, RenderContext, render
from .replies import (
    Compaction,
    CustomToolCall,
    ErrorEvent,
    FailedInStream,
    FunctionCall,
    HttpError,
    Item,
    Raw,
    Reasoning,
    Reply,
    ReplyOptions,
    Responder,
    Response,
    Text,
    WebSearch,
    context_length_exceeded_400,
    insufficient_quota_429,
    rate_limited_429,
    server_error_500,
)
from .wire import CONTEXT_LENGTH_MESSAGE

__all__ = [
    "CONTEXT_LENGTH_MESSAGE",
    "Compaction",
    "CustomToolCall",
    "Emulator",
    "ErrorEvent",
    "FailedInStream",
    "FunctionCall",
    "HttpError",
    "Item",
    "Plan",
    "Raw",
    "Reasoning",
    "ReceivedRequest",
    "RenderContext",
    "Reply",
    "ReplyOptions",
    "Responder",
    "Response",
    "Text",
    "WebSearch",
    "compaction_reply",
    "context_length_exceeded_400",
    "echo_reply",
    "insufficient_quota_429",
    "rate_limited_429",
    "render",
    "server_error_500",
]
