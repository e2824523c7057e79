"""orjson's output, right-sized where it is kept.

orjson (3.12 on) hands back a `bytes` whose allocation is its writer's buffer, not the output's length: at least
4 KiB, and for longer output the buffer it grew to (the logical length is set, the buffer is not shrunk;
`sys.getsizeof` shows the length only). Measured here with orjson 3.13.0: 100,000 serialized input items of
≈60 bytes each, as the journal keeps them until they are written (`InputView.raw`, `PutItem.raw`), held 393 MB
of RSS; right-sized copies of them 10 MB. A 100,000-item request's journal work peaked at ≈960 MB for it.

What is serialized and dropped at once (a hash's input, a body sent on) needs none of this; what is held — a
journal item until its commit, a session's last input, a compaction item — goes through `kept`. The copy costs
about what a small `orjson.dumps` costs (≈0.3 µs); `b"".join` with an empty second part is the cheapest copy
(two parts always make a new object; one would be returned as it is).
"""

from __future__ import annotations

from typing import Any

import orjson


def kept(data: bytes) -> bytes:
    """`data` in a new bytes object of its own length (for orjson's output that will be held)."""
    return b"".join((data, b""))


def dumps_kept(value: Any, option: int | None = None) -> bytes:
    """`orjson.dumps(value)` right-sized, for a result that is held rather than sent on or hashed at once."""
    return kept(orjson.dumps(value) if option is None else orjson.dumps(value, option=option))
