"""Scripted replies from JSON: the same replies as `replies.py`, for the command line and for Python.

    python -m tests.emulator --script replies.json --port 0
    emu.load_script("replies.json")        # or a dict / list already parsed

A script is a list of replies (the `POST …/responses` turns, in order), or an object
`{"responses": [...], "compaction": [...], "compact": [...], "default": reply}` naming the queues
of `Emulator.script`, `script_compaction`, `script_compact` and `set_default`. A reply is an object
with `"type"` and the fields of its class (reply options such as `usage`, `delays`, `latency` too):

    [
      {"type": "response", "items": [
          {"type": "reasoning", "summary": "plan", "encrypted_content": "gAAAAB..."},
          {"type": "function_call", "name": "notes_write_file", "call_id": "call_1",
           "arguments": {"path": "plan.md", "text": "step 1"}}]},
      {"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch\\n..."},
      {"type": "text", "text": "done", "usage": {"input_tokens": 1200}},
      {"type": "http_error", "status": 429, "body": {"error": {"message": "slow down", "type": "tokens",
                                                              "param": null, "code": "rate_limit_exceeded"}}}
    ]

Types: text, function_call, custom_tool_call, web_search, reasoning, compaction, item (any output item,
verbatim: `{"type": "item", "item": {...}}`), response (`items`: output items), failed_in_stream,
error_event, http_error, raw (`body`: a string, or a list of strings streamed one write each), and the
shorthands context_length_exceeded_400, rate_limited_429, insufficient_quota_429, server_error_500.
Unknown types and unknown fields are errors that name where they are (`ScriptError`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

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
    Response,
    Text,
    WebSearch,
    context_length_exceeded_400,
    insufficient_quota_429,
    rate_limited_429,
    server_error_500,
)

ITEM_TYPES: dict[str, type] = {
    "text": Text,
    "function_call": FunctionCall,
    "custom_tool_call": CustomToolCall,
    "web_search": WebSearch,
    "reasoning": Reasoning,
    "compaction": Compaction,
    "item": Item,
}
REPLY_TYPES: dict[str, type] = {
    **ITEM_TYPES,
    "response": Response,
    "failed_in_stream": FailedInStream,
    "error_event": ErrorEvent,
    "http_error": HttpError,
    "raw": Raw,
}
SHORTHANDS: dict[str, Callable[..., HttpError]] = {
    "context_length_exceeded_400": context_length_exceeded_400,
    "rate_limited_429": rate_limited_429,  # takes "retry_after"
    "insufficient_quota_429": insufficient_quota_429,
    "server_error_500": server_error_500,
}
QUEUES = ("responses", "compaction", "compact")


class ScriptError(ValueError):
    """A script that does not say a reply the emulator can send; the message names where."""


@dataclass
class Script:
    responses: list[Reply] = field(default_factory=list)
    compaction: list[Reply] = field(default_factory=list)
    compact: list[Reply] = field(default_factory=list)
    default: Reply | None = None


@functools.cache
def _adapter(cls: type) -> TypeAdapter[Any]:
    return TypeAdapter(cls)


def _build(cls: type, fields: dict[str, Any], where: str) -> Any:
    known = {f.name for f in dataclasses.fields(cls)}
    if unknown := sorted(set(fields) - known):
        raise ScriptError(f"{where}: unknown field(s) {', '.join(unknown)} for {cls.__name__} "
                          f"(known: {', '.join(sorted(known))})")
    try:
        return _adapter(cls).validate_python(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ScriptError(f"{where}: {loc + ': ' if loc else ''}{first['msg']}") from None


def parse_reply(data: Any, where: str = "reply", *, types: Mapping[str, type] = REPLY_TYPES) -> Reply:
    if not isinstance(data, Mapping):
        raise ScriptError(f"{where}: a reply is a JSON object with a \"type\", not {type(data).__name__}")
    fields = dict(data)
    kind = fields.pop("type", None)
    if kind in SHORTHANDS and types is REPLY_TYPES:
        try:
            return SHORTHANDS[kind](**fields)
        except TypeError as exc:
            raise ScriptError(f"{where}: {kind}: {exc}") from None
    cls = types.get(kind) if isinstance(kind, str) else None
    if cls is None:
        names = sorted(types) + (sorted(SHORTHANDS) if types is REPLY_TYPES else [])
        raise ScriptError(f"{where}: unknown type {kind!r}; one of {', '.join(names)}")
    if cls is Response and "items" in fields:
        if not isinstance(fields["items"], list):
            raise ScriptError(f"{where}.items: a list of output items")
        fields["items"] = [parse_reply(item, f"{where}.items[{i}]", types=ITEM_TYPES)
                           for i, item in enumerate(fields["items"])]
    if cls is Raw and isinstance(fields.get("body"), list):
        fields["body"] = [c.encode() if isinstance(c, str) else c for c in fields["body"]]
    return _build(cls, fields, where)


def parse_script(data: Any, where: str = "script") -> Script:
    if isinstance(data, list):
        data = {"responses": data}
    if not isinstance(data, Mapping):
        raise ScriptError(f"{where}: a list of replies or an object with {', '.join(QUEUES)}, default")
    if unknown := sorted(set(data) - {*QUEUES, "default"}):
        raise ScriptError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(QUEUES)}, default")
    script = Script()
    for queue in QUEUES:
        entries = data.get(queue, [])
        if not isinstance(entries, list):
            raise ScriptError(f"{where}.{queue}: a list of replies")
        getattr(script, queue).extend(parse_reply(r, f"{where}.{queue}[{i}]") for i, r in enumerate(entries))
    if data.get("default") is not None:
        script.default = parse_reply(data["default"], f"{where}.default")
    return script


def load_script(source: str | Path | Mapping[str, Any] | list[Any]) -> Script:
    """A script from a JSON file (path) or from data already parsed."""
    if isinstance(source, str | Path):
        path = Path(source)
        try:
            data = orjson.loads(path.read_bytes())
        except OSError as exc:
            raise ScriptError(f"{path}: {exc.strerror or exc}") from None
        except orjson.JSONDecodeError as exc:
            raise ScriptError(f"{path}: not JSON: {exc}") from None
        return parse_script(data, str(path))
    return parse_script(source)
