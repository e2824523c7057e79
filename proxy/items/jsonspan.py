"""Where one top-level member's value lies in a JSON object's bytes, found without a second full parse (pure).

A big Responses body is nearly all `input`. Knowing the bytes of that value lets the body writer send a body whose
other members a stage changed (web search adds a tool) with the client's `input` bytes as they came, instead of
serializing 1.5 MB again, and lets the journal compare a resend on those bytes.

The search is a guess checked until it is certain. A candidate is an occurrence of the key's JSON text followed
by `:`; it is taken only when everything before it, closed with `}`, is a JSON object with exactly the members
that precede the key in the parsed body, and everything after the value, opened with `{`, is one with exactly
the members that follow it. An occurrence anywhere else (inside a string, or as a key of a nested object: an
`input` property of a tool's schema, an item of the input itself) leaves one of the two sides unbalanced, so it
does not parse. Only the few members beside the value are parsed again, never the value. Whatever cannot be
made certain (the key escaped differently, a repeated key, too many candidates) is None: the caller does what
it did before (serialize the parsed value).
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

_WS = b" \t\n\r"
MAX_CANDIDATES = 8  # occurrences of the key tried on each side before giving up (each costs one small parse)


def strip_ws(raw: bytes, start: int, end: int) -> tuple[int, int]:
    """`raw[start:end]` without the JSON whitespace at either end, as (start, end)."""
    start = _lstrip(raw, start)
    return (start, max(start, _rstrip(raw, end)))


def _lstrip(raw: bytes, i: int) -> int:
    n = len(raw)
    while i < n and raw[i] in _WS:
        i += 1
    return i


def _rstrip(raw: bytes, end: int) -> int:
    """The end (exclusive) of `raw[:end]` without trailing whitespace."""
    while end > 0 and raw[end - 1] in _WS:
        end -= 1
    return end


def _keys_of(text: bytes) -> list[str] | None:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return list(value) if isinstance(value, dict) else None


def _value_start(raw: bytes, key_at: int, key_len: int) -> int | None:
    """Where the value begins after the key token at `key_at`, or None when no `:` follows it."""
    colon = _lstrip(raw, key_at + key_len)
    if colon >= len(raw) or raw[colon] != 0x3A:  # ':'
        return None
    return _lstrip(raw, colon + 1)


def _start(raw: bytes, keys: Sequence[str], index: int, token: bytes) -> int | None:
    """The value's first byte: the key occurrence whose preceding members are exactly `keys[:index]`."""
    at = raw.find(token)
    for _ in range(MAX_CANDIDATES):
        if at < 0:
            return None
        start = _value_start(raw, at, len(token))
        if start is not None:
            head_end = _rstrip(raw, at)
            if index == 0:
                ok = raw[_lstrip(raw, 0):head_end] == b"{"
            else:
                ok = head_end > 0 and raw[head_end - 1] == 0x2C and (  # ','
                    _keys_of(raw[:head_end - 1] + b"}") == list(keys[:index]))
            if ok:
                return start
        at = raw.find(token, at + 1)
    return None


def _end(raw: bytes, keys: Sequence[str], index: int, start: int) -> int | None:
    """The value's end (exclusive): before the members that follow it, or before the closing `}`."""
    if index == len(keys) - 1:
        close = _rstrip(raw, len(raw))
        if close == 0 or raw[close - 1] != 0x7D:  # '}'
            return None
        end = _rstrip(raw, close - 1)
        return end if end > start else None
    token = orjson.dumps(keys[index + 1])
    at = raw.rfind(token)
    for _ in range(MAX_CANDIDATES):
        if at <= start:
            return None
        if _value_start(raw, at, len(token)) is not None and _keys_of(b"{" + raw[at:]) == list(keys[index + 1:]):
            comma = _rstrip(raw, at)
            if comma > start and raw[comma - 1] == 0x2C:  # ','
                end = _rstrip(raw, comma - 1)
                return end if end > start else None
            return None
        at = raw.rfind(token, start, at)
    return None


def member_span(raw: bytes, keys: Sequence[str], key: str) -> tuple[int, int] | None:
    """`(start, end)` with `raw[start:end]` the JSON text of member `key`'s value, in the JSON object `raw` whose
    members are `keys` in order (as parsed from `raw`, each once); None when it cannot be made certain."""
    if keys.count(key) != 1:
        return None
    index = keys.index(key)
    start = _start(raw, keys, index, orjson.dumps(key))
    if start is None:
        return None
    end = _end(raw, keys, index, start)
    if end is None:
        return None
    return start, end
