"""The prompt cache, modelled on the published rules (research/responses-api.md, anchors-2026-12-07.md §2.2).

A request's prompt is its `tools`, then `instructions`, then its input items (after the `previous_response_id`
chain's), each serialized as received: the cache compares bytes, so an item that changes shape (a key added, a
field dropped) is a miss from there on.
- Cached tokens are the longest prefix this bucket has seen before, counted in 128-token steps after a
  1,024-token minimum, never more than the request's input tokens. A bucket is the request's `prompt_cache_key`,
  or without one the shared keyless bucket (where only the same leading prefix matches anyway).
- `prompt_cache_options.mode`: `implicit` (the default) writes the whole prompt; `explicit` writes only up to the
  content parts marked `prompt_cache_breakpoint` (the latest 4; none: nothing written). `ttl` ("30m", "12h", or
  the deprecated `prompt_cache_retention` "24h"/"in_memory") is the minimum lifetime of what it writes, refreshed
  by every hit; the default is the in-memory 10 minutes. `prewarm: true` writes without generating (app.py).
- `input_transformations`: a reasoning item the model produced is `removed` with `prefix_mismatch` when the input
  before it is not the prompt that produced it (an earlier item was edited), as GPT-6.2 does.
Pure apart from the clock (injectable: a test advances time instead of sleeping).
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

MINIMUM = 1024  # tokens: a shorter prompt is never cached
STEP = 128  # tokens: hits grow in these steps after the minimum
DEFAULT_TTL = 600.0  # seconds: the in-memory cache's lifetime without options ("5-10 minutes of inactivity")
TTLS = {"30m": 1800.0, "12h": 43_200.0, "24h": 86_400.0, "in_memory": DEFAULT_TTL}
MAX_BREAKPOINTS = 4
KEEP = 64  # prompts remembered per bucket (the oldest forgotten first)
MAX_REASONING = 100_000  # produced reasoning items remembered (for prefix_mismatch)


def prompt_parts(body: Mapping[str, Any], chain: Sequence[Any], items: Sequence[Any]) -> list[bytes]:
    """The prompt as the cache sees it: tools, instructions, then every input item (the chain's first)."""
    instructions = body.get("instructions")
    parts = [orjson.dumps(body.get("tools") or []),
             instructions.encode("utf-8") if isinstance(instructions, str) else b""]
    parts += [orjson.dumps(item) for item in (*chain, *items)]
    return parts


def part_name(index: int) -> str:
    return "tools" if index == 0 else "instructions" if index == 1 else f"input[{index - 2}]"


def first_difference(old: Sequence[bytes], new: Sequence[bytes]) -> int | None:
    """The first part of `old` that `new` does not repeat byte for byte (None: `new` extends `old`)."""
    for i, part in enumerate(old):
        if i >= len(new) or new[i] != part:
            return i
    return None


def cached_steps(tokens: int) -> int:
    """What a hit of `tokens` prefix tokens is reported as: 0 under the minimum, else down to a 128 step."""
    return 0 if tokens < MINIMUM else MINIMUM + (tokens - MINIMUM) // STEP * STEP


def _common_prefix(a: bytes, b: bytes) -> int:
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # the longest equal prefix, by halving (memcmp does the work)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _options(body: Mapping[str, Any]) -> Mapping[str, Any]:
    opts = body.get("prompt_cache_options")
    return opts if isinstance(opts, Mapping) else {}


def ttl_of(body: Mapping[str, Any]) -> float:
    ttl = _options(body).get("ttl")
    if isinstance(ttl, str) and ttl in TTLS:
        return TTLS[ttl]
    legacy = body.get("prompt_cache_retention")
    return TTLS.get(legacy, DEFAULT_TTL) if isinstance(legacy, str) else DEFAULT_TTL


def is_prewarm(body: Mapping[str, Any]) -> bool:
    return _options(body).get("prewarm") is True


def _breakpoints(item: Any) -> bool:
    content = item.get("content") if isinstance(item, dict) else None
    return isinstance(content, list) and any(
        isinstance(p, dict) and isinstance(p.get("prompt_cache_breakpoint"), dict) for p in content)


@dataclass
class _Entry:
    prompt: bytes
    written: tuple[int, ...] | None  # byte offsets written (explicit mode); None: all of it (implicit)
    expires: float
    ttl: float


@dataclass(frozen=True)
class CacheResult:
    input_tokens: int
    cached_tokens: int
    write_tokens: int
    transformations: list[dict[str, Any]]
    parts: list[bytes] = field(repr=False)
    bucket: str | None = None


class PromptCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._buckets: dict[str | None, deque[_Entry]] = {}
        # reasoning id -> digest of the prompt bytes that must precede it (the prompt that produced it)
        self._produced: OrderedDict[str, bytes] = OrderedDict()

    def clear(self) -> None:
        self._buckets.clear()
        self._produced.clear()

    def serve(self, body: Mapping[str, Any], chain: Sequence[Any], items: Sequence[Any],
              input_tokens: int) -> CacheResult:
        """Look the request's prompt up, write it, and say what the upstream reports."""
        parts = prompt_parts(body, chain, items)
        prompt = b"".join(parts)
        key = body.get("prompt_cache_key")
        bucket = key if isinstance(key, str) else None
        now = self.clock()
        entries = self._buckets.setdefault(bucket, deque())
        while entries and entries[0].expires <= now and all(e.expires <= now for e in entries):
            entries.popleft()
        hit = 0
        for entry in entries:
            if entry.expires <= now:
                continue
            lcp = _common_prefix(prompt, entry.prompt)
            got = lcp if entry.written is None else max((p for p in entry.written if p <= lcp), default=0)
            if got > 0 and cached_steps(self._tokens(got, prompt, input_tokens)) > 0:
                entry.expires = max(entry.expires, now + entry.ttl)  # a hit keeps it alive
            hit = max(hit, got)
        cached = min(input_tokens, cached_steps(self._tokens(hit, prompt, input_tokens)))
        written = self._write(body, parts, prompt, entries, now, input_tokens)
        write_tokens = max(0, self._tokens(written, prompt, input_tokens) - cached) if written else 0
        return CacheResult(input_tokens, cached, write_tokens, self._removed(parts, chain, items), parts, bucket)

    @staticmethod
    def _tokens(nbytes: int, prompt: bytes, input_tokens: int) -> int:
        return input_tokens * nbytes // len(prompt) if prompt else 0

    def _write(self, body: Mapping[str, Any], parts: list[bytes], prompt: bytes, entries: deque[_Entry],
               now: float, input_tokens: int) -> int:
        """Remember the prompt (as the mode says); how many of its bytes were written."""
        if input_tokens < MINIMUM:
            return 0
        written: tuple[int, ...] | None = None
        if _options(body).get("mode") == "explicit":
            offsets, end = [], len(parts[0]) + len(parts[1])
            for part in parts[2:]:
                end += len(part)
                if _breakpoints(orjson.loads(part)):
                    offsets.append(end)
            written = tuple(offsets[-MAX_BREAKPOINTS:])
            if not written:
                return 0  # explicit without a breakpoint: the request is not cached
        ttl = ttl_of(body)
        for old in list(entries):  # a prompt this one extends is covered by it
            if old.written is None and written is None and prompt.startswith(old.prompt):
                entries.remove(old)
        entries.append(_Entry(prompt, written, now + ttl, ttl))
        while len(entries) > KEEP:
            entries.popleft()
        return len(prompt) if written is None else written[-1]

    def produced(self, parts: list[bytes], output: Sequence[Any]) -> None:
        """The reasoning items a response produced, each with the bytes that must come before it."""
        running = hashlib.sha256()
        for part in parts:
            running.update(part)
        for item in output:
            if isinstance(item, dict) and item.get("type") == "reasoning" and isinstance(item.get("id"), str):
                self._produced[item["id"]] = running.copy().digest()
            running.update(orjson.dumps(item))
        while len(self._produced) > MAX_REASONING:
            self._produced.popitem(last=False)

    def _removed(self, parts: list[bytes], chain: Sequence[Any], items: Sequence[Any]) -> list[dict[str, Any]]:
        """`prefix_mismatch` for each produced reasoning item whose earlier input was edited."""
        out: list[dict[str, Any]] = []
        running = hashlib.sha256()
        running.update(parts[0])
        running.update(parts[1])
        for item, part in zip((*chain, *items), parts[2:], strict=True):
            rid = item.get("id") if isinstance(item, dict) and item.get("type") == "reasoning" else None
            want = self._produced.get(rid) if isinstance(rid, str) else None
            if want is not None and running.copy().digest() != want:
                out.append({"type": "reasoning", "id": rid, "action": "removed", "reason": "prefix_mismatch"})
            running.update(part)
        return out
