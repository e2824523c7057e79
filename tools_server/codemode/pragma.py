"""The optional first-line pragma of an `exec` cell (seed 004 §5.7, Codex's `// @exec:` line).

    // @exec: {"yield_time_ms": 5000, "max_output_tokens": 2000}

A pure parser: the source in, the source with that line blanked (so line numbers in errors stay the
user's) and the two settings out. Unknown keys, bad JSON, non-integers and conflicts with the same
setting given as an explicit argument are errors before any isolate starts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from proxy.errors import CtproxyError

PRAGMA_KEYS = ("yield_time_ms", "max_output_tokens")
MAX_SAFE_INTEGER = 2**53 - 1  # JS-safe integers, as Codex accepts them
_PRAGMA = re.compile(r"^[ \t]*//[ \t]*@exec:(.*)$")


class PragmaError(CtproxyError, ValueError):
    """A pragma the cell cannot start with; the message says what to change."""


@dataclass(frozen=True)
class Pragma:
    source: str  # the code with the pragma line blanked
    yield_time_ms: int | None = None
    max_output_tokens: int | None = None


def parse_pragma(code: str, yield_time_ms: int | None = None, max_output_tokens: int | None = None) -> Pragma:
    """Apply the first-line pragma, if any, to the explicit arguments (None: not given)."""
    first, sep, rest = code.partition("\n")
    match = _PRAGMA.match(first.rstrip("\r"))
    if match is None:
        return Pragma(code, yield_time_ms, max_output_tokens)
    if not rest.strip():
        raise PragmaError("exec pragma must be followed by JavaScript source on later lines")
    try:
        values = json.loads(match.group(1))
    except ValueError:
        raise PragmaError('exec pragma is not valid JSON; write `// @exec: {"yield_time_ms": 10000}`') from None
    if not isinstance(values, dict):
        raise PragmaError("exec pragma must be a JSON object")
    unknown = [k for k in values if k not in PRAGMA_KEYS]
    if unknown:
        raise PragmaError(f"exec pragma only supports `yield_time_ms` and `max_output_tokens`; got `{unknown[0][:60]}`")
    settings: dict[str, int] = {}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SAFE_INTEGER:
            raise PragmaError(f"exec pragma `{key}` must be a non-negative integer")
        settings[key] = value
    explicit = {"yield_time_ms": yield_time_ms, "max_output_tokens": max_output_tokens}
    for key, value in settings.items():
        if explicit[key] is not None and explicit[key] != value:
            raise PragmaError(f"exec pragma `{key}` ({value}) conflicts with the `{key}` argument "
                              f"({explicit[key]}); give it once")
    merged = {k: settings.get(k, explicit[k]) for k in PRAGMA_KEYS}
    return Pragma("" + sep + rest, merged["yield_time_ms"], merged["max_output_tokens"])
