"""Header values read straight from mitmproxy's raw `Headers.fields`, several in one pass.

Each `Headers.get` is a pass that decodes and lower-cases every name; the stages on a small request's way ask
two or three headers of the same message. `values` answers them together, as `Headers.get` would (case-
insensitive names, repeats joined by ", ", "" when absent).
"""

from __future__ import annotations

from collections.abc import Sequence


def values(fields: Sequence[tuple[bytes, bytes]], *names: bytes) -> tuple[str, ...]:
    """The value of each of `names` (lower-case bytes) in `fields`."""
    found: list[list[bytes]] = [[] for _ in names]
    for name, value in fields:
        low = name.lower()
        for k, wanted in enumerate(names):
            if low == wanted:
                found[k].append(value)
                break
    return tuple(b", ".join(v).decode("utf-8", "surrogateescape") for v in found)
