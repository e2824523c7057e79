"""Issue 47, the pure parts: the reminder said once and kept in place, the derived prompt_cache_key, the pre-warm
body and model gate, the cache statistics (a miss inside a window, prefix_mismatch drops, tokens saved), the
forwarded-tools memo, and `ctproxy show`'s lines read back from the state database."""

from __future__ import annotations

import sqlite3
from typing import Any

from proxy.windows import cache_stats, prewarm
from proxy.windows.notes import cache_key, reminder
from proxy.windows.notes.last_tools import LastTools


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_a_said_reminder_stays_where_it_was_said() -> None:
    first = reminder.with_reminder([user("a"), user("b")], "<ctproxy_context_reminder>\nfull\n")
    assert reminder.is_reminder(first[-1])
    said = (2, "<ctproxy_context_reminder>\nfull\n")
    # the next request: the agent's items grew (and a resent reminder is dropped); the reminder stays at 2
    later = reminder.with_said([user("a"), user("b"), user("c"), first[-1]], said)
    assert later[:3] == [*first[:2], first[2]] and later[3] == user("c") and len(later) == 4
    assert reminder.with_said([user("a")], said) == [user("a")]  # the input no longer reaches that far


def test_the_derived_key_is_stable_short_and_never_replaces_the_clients() -> None:
    a = cache_key.with_key({"model": "m"}, "session-1")
    assert a["prompt_cache_key"] == cache_key.with_key({"model": "m"}, "session-1")["prompt_cache_key"]
    assert a["prompt_cache_key"] != cache_key.derived("session-2") and len(a["prompt_cache_key"]) <= 64
    assert "session-1" not in a["prompt_cache_key"]
    own = {"model": "m", "prompt_cache_key": "conv-9"}
    assert cache_key.with_key(own, "session-1") is own
    assert cache_key.with_key({"model": "m"}, None) == {"model": "m"}


def test_prewarm_only_on_models_that_take_it_and_only_the_bootstrap() -> None:
    assert [prewarm.supports(m) for m in ("gpt-5.6", "gpt-5.6-mini", "gpt-6", "gpt-6.2-codex", "gpt-5.5", "gpt-5",
                                          "gpt-4.1", None)] == [True, True, True, True, False, False, False, False]
    dev = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "guidance"}]}
    first = {"model": "gpt-6", "instructions": "i", "tools": [{"type": "function", "name": "x"}], "stream": True,
             "input": [dev, dev, user("go")], "prompt_cache_options": {"ttl": "12h"}}
    warm = prewarm.body(first, {"tools": [{"type": "function", "name": "y"}], "prompt_cache_key": "k"})
    assert warm is not None and warm["input"] == [dev, dev] and warm["tools"] == [{"type": "function", "name": "y"}]
    assert warm["prompt_cache_options"] == {"ttl": "12h", "prewarm": True} and warm["prompt_cache_key"] == "k"
    assert warm["stream"] is False and warm["store"] is False and warm["instructions"] == "i"
    assert prewarm.body({**first, "input": [user("go")]}, None) is None  # no bootstrap: nothing to warm


def test_a_miss_is_a_fall_short_of_the_previous_prompt() -> None:
    seen = cache_stats.seen_of({"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 4864}},
                               [{"type": "reasoning", "id": "rs_1", "action": "removed", "reason": "prefix_mismatch"},
                                {"type": "reasoning", "id": "rs_2", "action": "removed", "reason": "model_mismatch"}])
    assert seen is not None and (seen.dropped, seen.prefix_mismatch) == (2, 1)
    assert not cache_stats.is_miss(4900, seen)  # within two steps of the previous prompt
    assert not cache_stats.is_miss(None, seen) and not cache_stats.is_miss(900, seen)
    cold = cache_stats.seen_of({"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 1024}}, None)
    assert cold is not None and cache_stats.is_miss(4900, cold)
    assert cache_stats.seen_of({"output_tokens": 3}, None) is None


def test_the_table_adds_up_and_show_renders_it(tmp_path) -> None:
    from proxy.db import connect

    conn = connect(tmp_path / "state.db")
    rows = [("w1", cache_stats.Seen(2000, 0, 0, 0), False), ("w1", cache_stats.Seen(3000, 1920, 0, 0), False),
            ("w2", cache_stats.Seen(1500, 0, 0, 0, prewarm=True), False),
            ("w2", cache_stats.Seen(1800, 1408, 1, 1), False), ("w2", cache_stats.Seen(2200, 1792, 0, 0), False)]
    for n, (window, seen, miss) in enumerate(rows):
        cache_stats.write(conn, "s1", window, "t", "/root", seen, miss, float(n))
    conn.commit()
    windows = cache_stats.read(conn, "s1")
    assert [(w.window_id, w.requests, w.input_tokens, w.cached_tokens, w.prewarms, w.prewarm_tokens)
            for w in windows] == [("w1", 2, 5000, 1920, 0, 0), ("w2", 2, 4000, 3200, 1, 1500)]
    assert windows[1].first_input == 1800 and windows[0].last_input == 3000
    t = cache_stats.totals(windows)
    assert t["prefix_mismatch"] == 1 and t["saved_tokens"] == 2 * (3000 - 1800) - 1800 - 1500
    text = cache_stats.render(windows)
    assert "56.9% of 9000 input tokens cached" in text and "w2: 80.0% cached" in text
    assert cache_stats.read(sqlite3.connect(":memory:"), "s1") == []  # a store without the table


def test_the_forwarded_tools_memo_is_bounded() -> None:
    memo = LastTools(limit=2)
    memo.remember("a", {"tools": [1], "prompt_cache_key": "k", "input": []})
    memo.remember("b", {"tools": [2]})
    memo.remember("c", {})
    assert memo.get("a") is None and memo.get("b") == {"tools": [2]} and memo.get("c") == {}
