"""A faithful OpenAI Responses upstream for tests and benchmarks (aiohttp, loopback).

    from tests.emulator import Emulator, Text, FunctionCall, Response, context_length_exceeded_400

    async with Emulator() as emu:                      # emu.url == "http://127.0.0.1:PORT"
        emu.script(                                    # consumed in order by the next /responses turns
            Response([Reasoning(summary="plan"), FunctionCall("get_weather", {"city": "Paris"})]),
            context_length_exceeded_400(),
            Text("done", deltas=5, usage={"input_tokens": 250_000}),
        )
        ...                                            # an empty queue falls back to an echo answer
        req = emu.responses_requests[0]                # ReceivedRequest: headers, raw_body, json, …

Replies (`replies.py`): Text, FunctionCall, CustomToolCall, WebSearch, Reasoning, Compaction, Item,
Response(items=[…]), FailedInStream, ErrorEvent(nested=…), HttpError (+ context_length_exceeded_400,
rate_limited_429, insufficient_quota_429, server_error_500), Raw; or a callable
`(ReceivedRequest) -> reply`. Options on any reply: usage=, delays={i: s}, pause_after_first=,
disconnect_after=N, latency=, headers=, stall_after=N / stall_before_headers=True (silent until the client
closes the connection).

Queues: `script` (turns), `script_compaction` (input ends with `compaction_trigger`; default:
reasoning + one compaction item, deterministic per input), `script_compact` (`/responses/compact`).
`set_default(reply, route=…)` replaces the fallback; `reset()` forgets everything.
Scripts from JSON (`script.py`): `emu.load_script("replies.json")`, or `--script FILE` standalone.
Input rules (`validation.py`, on by default, as the real API): every function/custom tool call has its
output and every output its call (across the `previous_response_id` chain, which resolves against the
stored responses: `store: false` ones are never found), a reasoning item is followed by the item it
preceded, `item_reference`s name stored items; each refused with the API's own 400/404.
`check_input_items=False` skips them (a test that must send what the API refuses).
Knobs: `token_counter` (usage.input_tokens; default bytes of input+instructions+tools / 4),
`validate_requests` (400 on bodies that violate CreateResponse), `check_previous_response_id`,
`context_limit_bytes` (the real 400 `context_length_exceeded` for a `POST …/responses` body above N bytes,
turns and compaction triggers; `/responses/compact` is not limited: an upstream whose window is smaller
than the model table says).
Standalone: `python -m tests.emulator --port N [--deltas 200] [--script FILE]` from the repository root.
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
from .script import Script, ScriptError, load_script, parse_reply, parse_script
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
    "Script",
    "ScriptError",
    "Text",
    "WebSearch",
    "compaction_reply",
    "context_length_exceeded_400",
    "echo_reply",
    "insufficient_quota_429",
    "load_script",
    "parse_reply",
    "parse_script",
    "rate_limited_429",
    "render",
    "server_error_500",
]
