"""orjson's output, right-sized where it is kept (proxy/items/jsonbytes.py)."""

from __future__ import annotations

import tracemalloc

import orjson

from proxy.items.jsonbytes import dumps_kept, kept


def _allocated(make) -> int:
    """Bytes still allocated by what `make` returns (tracemalloc sees the allocation, not the length)."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        held = [make() for _ in range(100)]
        size = (tracemalloc.get_traced_memory()[0] - before) // len(held)
    finally:
        tracemalloc.stop()
    return size


def test_kept_bytes_are_the_same_bytes_in_an_allocation_of_their_own_length():
    item = {"type": "message", "role": "user", "content": "hello"}
    assert kept(orjson.dumps(item)) == orjson.dumps(item)
    assert dumps_kept(item) == orjson.dumps(item)
    assert dumps_kept({"b": 1, "a": 2}, option=orjson.OPT_SORT_KEYS) == b'{"a":2,"b":1}'
    assert kept(b"") == b"" and type(kept(bytearray(b"x"))) is bytes
    assert _allocated(lambda: dumps_kept(item)) < 200  # header and the ≈60 bytes, whatever orjson allocates
    big = [item] * 1000
    assert _allocated(lambda: dumps_kept(big)) < len(orjson.dumps(big)) + 200
