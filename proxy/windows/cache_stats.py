"""What the upstream's prompt cache did for each session and window (issue 47, docs/prompt-cache.md): from every
answer's `usage.input_tokens_details.cached_tokens` and `Response.input_transformations`.

Per (session, window), in the state database table `prompt_cache` and the process's /metrics:
- requests, input tokens, cached tokens (the cached share is cached / input);
- misses: an answer inside a window whose cached tokens fell short of the previous answer's whole prompt by more
  than two 128-token steps (the prefix broke, or the cache expired): ctproxy's own requests extend the window's
  prefix byte for byte (tests/proxy/windows/test_prefix_rule.py), so in a window ctproxy manages this should stay 0;
- reasoning items the upstream dropped, by reason (`prefix_mismatch`: an earlier input was edited);
- pre-warm requests (proxy/windows/prewarm.py) and the input tokens they cost.
The tokens a rollover or compaction saved (`saved`, shown by `ctproxy show`) are estimated from the drop in input
tokens between a window's last answer and the next window's first, net of the cache the change cost."""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy import dbworker
from proxy.db import register_schema

register_schema(
    "prompt_cache",
    """
    CREATE TABLE IF NOT EXISTS prompt_cache (
        session_key TEXT NOT NULL,
        window_id TEXT NOT NULL,
        task TEXT,
        agent TEXT,
        requests INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        cached_tokens INTEGER NOT NULL DEFAULT 0,
        misses INTEGER NOT NULL DEFAULT 0,
        reasoning_dropped INTEGER NOT NULL DEFAULT 0,
        prefix_mismatch INTEGER NOT NULL DEFAULT 0,
        prewarms INTEGER NOT NULL DEFAULT 0,
        prewarm_tokens INTEGER NOT NULL DEFAULT 0,
        first_input INTEGER,
        last_input INTEGER,
        updated_at REAL NOT NULL,
        PRIMARY KEY (session_key, window_id)
    );
    CREATE INDEX IF NOT EXISTS prompt_cache_by_agent ON prompt_cache(task, agent, updated_at);
    """,
)

STEP = 128
MINIMUM = 1024
MAX_SESSIONS = 4096


@dataclass(frozen=True)
class Seen:
    """One answer, as the cache statistics need it."""

    input_tokens: int
    cached_tokens: int
    dropped: int  # reasoning items the upstream removed
    prefix_mismatch: int  # … of which for prefix_mismatch
    prewarm: bool = False


def seen_of(usage: Mapping[str, Any] | None, transformations: Any, prewarm: bool = False) -> Seen | None:
    if not isinstance(usage, Mapping) or not isinstance(usage.get("input_tokens"), int):
        return None
    details = usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    drops = [t for t in transformations or [] if isinstance(t, Mapping) and t.get("action") == "removed"]
    return Seen(usage["input_tokens"], cached if isinstance(cached, int) else 0, len(drops),
                sum(1 for t in drops if t.get("reason") == "prefix_mismatch"), prewarm)


def is_miss(previous_input: int | None, seen: Seen) -> bool:
    """The answer's cached tokens fell short of the previous answer's whole prompt (in the same window)."""
    if previous_input is None or previous_input < MINIMUM or seen.prewarm:
        return False
    return seen.cached_tokens < min(previous_input, seen.input_tokens) - 2 * STEP


class CacheStats:
    """The process's memo of each session's last answer in its window (for `is_miss`), and the writer."""

    def __init__(self) -> None:
        self._last: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, services: Any, db_path: Path, session_key: str, window_id: str, task: str | None,
                agent: str | None, seen: Seen) -> bool:
        """Count one answer; whether it was a miss inside its window."""
        with self._lock:
            last = self._last.get(session_key)
            miss = is_miss(last[1] if last is not None and last[0] == window_id else None, seen)
            if not seen.prewarm:
                self._last[session_key] = (window_id, seen.input_tokens)
                self._last.move_to_end(session_key)
                while len(self._last) > MAX_SESSIONS:
                    self._last.popitem(last=False)
        from proxy.metrics import proxy_metrics

        proxy_metrics().prompt_cache(seen.input_tokens, seen.cached_tokens, miss, seen.dropped,
                                     seen.prefix_mismatch, seen.prewarm)
        at = time.time()
        db = dbworker.shared(services, db_path)
        db.put_latest(("prompt_cache", session_key, window_id, at, id(seen)),
                      lambda conn: write(conn, session_key, window_id, task, agent, seen, miss, at))
        return miss


def write(conn: Any, session_key: str, window_id: str, task: str | None, agent: str | None, seen: Seen,
          miss: bool, at: float) -> None:
    req = 0 if seen.prewarm else 1
    conn.execute(
        "INSERT INTO prompt_cache (session_key, window_id, task, agent, requests, input_tokens, cached_tokens, misses,"
        " reasoning_dropped, prefix_mismatch, prewarms, prewarm_tokens, first_input, last_input, updated_at)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        " ON CONFLICT (session_key, window_id) DO UPDATE SET requests = requests + excluded.requests,"
        " input_tokens = input_tokens + excluded.input_tokens, cached_tokens = cached_tokens + excluded.cached_tokens,"
        " misses = misses + excluded.misses, reasoning_dropped = reasoning_dropped + excluded.reasoning_dropped,"
        " prefix_mismatch = prefix_mismatch + excluded.prefix_mismatch, prewarms = prewarms + excluded.prewarms,"
        " prewarm_tokens = prewarm_tokens + excluded.prewarm_tokens,"
        " first_input = coalesce(first_input, excluded.first_input),"
        " last_input = coalesce(excluded.last_input, last_input), updated_at = excluded.updated_at",
        (session_key, window_id, task, agent, req, seen.input_tokens if req else 0, seen.cached_tokens if req else 0,
         int(miss), seen.dropped, seen.prefix_mismatch, 1 - req, seen.input_tokens if not req else 0,
         seen.input_tokens if req else None, seen.input_tokens if req else None, at))


@dataclass(frozen=True)
class WindowCache:
    window_id: str
    requests: int
    input_tokens: int
    cached_tokens: int
    misses: int
    reasoning_dropped: int
    prefix_mismatch: int
    prewarms: int
    prewarm_tokens: int
    first_input: int | None
    last_input: int | None

    @property
    def cached_share(self) -> float | None:
        return self.cached_tokens / self.input_tokens if self.input_tokens else None


COLUMNS = ("window_id, requests, input_tokens, cached_tokens, misses, reasoning_dropped, prefix_mismatch, prewarms,"
           " prewarm_tokens, first_input, last_input")


def read(conn: Any, session_key: str) -> list[WindowCache]:
    """The session's windows in the order they were first answered ([] where the table is not: another store)."""
    if getattr(conn, "dialect", None) == "postgresql":
        # The figures live in the state directory's database only; a failed statement here would abort the
        # view's PostgreSQL transaction for every read after it.
        return []
    try:
        rows = conn.execute(f"SELECT {COLUMNS} FROM prompt_cache WHERE session_key = ? ORDER BY rowid",
                            (session_key,)).fetchall()
    except Exception:  # a store without the table (PostgreSQL keeps none): nothing to show
        return []
    return [WindowCache(*row) for row in rows]


def totals(windows: list[WindowCache]) -> dict[str, Any]:
    inp = sum(w.input_tokens for w in windows)
    cached = sum(w.cached_tokens for w in windows)
    return {"requests": sum(w.requests for w in windows), "input_tokens": inp, "cached_tokens": cached,
            "cached_share": cached / inp if inp else None, "misses": sum(w.misses for w in windows),
            "prefix_mismatch": sum(w.prefix_mismatch for w in windows),
            "reasoning_dropped": sum(w.reasoning_dropped for w in windows),
            "prewarms": sum(w.prewarms for w in windows), "prewarm_tokens": sum(w.prewarm_tokens for w in windows),
            "saved_tokens": saved(windows)}


def render(windows: list[WindowCache]) -> str:
    """`ctproxy show`'s prompt-cache lines: the session, then each window."""
    if not windows:
        return "prompt cache: no answers counted yet"
    t = totals(windows)
    share = f"{100 * t['cached_share']:.1f}%" if t["cached_share"] is not None else "-"
    lines = [f"prompt cache: {share} of {t['input_tokens']} input tokens cached over {t['requests']} requests; "
             f"{t['misses']} misses in a window, {t['prefix_mismatch']} reasoning items dropped (prefix_mismatch), "
             f"{t['prewarms']} pre-warms ({t['prewarm_tokens']} tokens), ~{t['saved_tokens']} tokens saved by window "
             "changes"]
    for w in windows:
        ws = f"{100 * w.cached_share:.1f}%" if w.cached_share is not None else "-"
        lines.append(f"  {w.window_id or '(no window)'}: {ws} cached of {w.input_tokens} over {w.requests} requests, "
                     f"{w.misses} misses, {w.prefix_mismatch} prefix_mismatch, {w.prewarms} pre-warms")
    return "\n".join(lines)


def saved(windows: list[WindowCache]) -> int:
    """An estimate of the input tokens the window changes saved: each new window's requests each sent the drop
    from the last prompt of the window before to its own first prompt fewer tokens, net of what the change cost
    the cache (the new window's first prompt, sent uncached) and of pre-warming it."""
    total = 0
    for before, after in itertools.pairwise(windows):
        if before.last_input is not None and after.first_input is not None:
            total += after.requests * (before.last_input - after.first_input) - after.first_input \
                - after.prewarm_tokens
    return total


STATS = CacheStats()
