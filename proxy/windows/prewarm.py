"""Pre-warming a new window's prefix (issue 47, docs/prompt-cache.md): when a rollover has just opened a window,
its leading bootstrap (the developer messages ctproxy put in front: guidance, identity, notes index, continuation)
goes up once with `prompt_cache_options.prewarm: true`, with the tools and cache key the session's requests carry,
so that the window's first request reads it from the cache instead of writing it.

Only on models that take `prompt_cache_options` (GPT-5.6 and later, GPT-6), only while `prompt_cache.prewarm` is on.
What it cost (its input tokens) is counted per window in `prompt_cache` (proxy/windows/cache_stats.py) and /metrics. A
failed pre-warm is only a cold cache: never a failed request."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.windows import cache_stats, checkpoint
from proxy.windows.remote.journal_link import WindowSession
from proxy.windows.service import WindowDeps

log = logging.getLogger("ctproxy.context")

_VERSION = re.compile(r"^gpt-(\d+)(?:\.(\d+))?")
FIRST = (5, 6)  # prompt_cache_options (and prewarm) from gpt-5.6 on
TIMEOUT = 30.0  # seconds: a pre-warm is a prefill without output
# what a pre-warm body keeps of the window's first request (the cache's prefix: tools, instructions, the model)
KEPT = ("model", "instructions", "tools", "prompt_cache_key", "reasoning", "text", "service_tier")


def supports(model: Any) -> bool:
    m = _VERSION.match(model) if isinstance(model, str) else None
    return m is not None and (int(m.group(1)), int(m.group(2) or 0)) >= FIRST


def leading(items: Sequence[Any]) -> list[Any]:
    """The developer messages in front of the window's input: its bootstrap."""
    out = []
    for item in items:
        if not isinstance(item, Mapping) or item.get("role") != "developer":
            break
        out.append(item)
    return out


def body(first: Mapping[str, Any], head: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The pre-warm request for a window whose first request is `first` (`head`: the tools and cache key the
    session's last request went up with, proxy/windows/notes/last_tools.py); None when there is nothing to warm."""
    inp = first.get("input")
    items = leading(inp) if isinstance(inp, list) else []
    if not items:
        return None
    out = {k: first[k] for k in KEPT if first.get(k) is not None} | dict(head or {})
    options = first.get("prompt_cache_options")
    out["prompt_cache_options"] = {**(options if isinstance(options, Mapping) else {}), "prewarm": True}
    out.update(input=items, store=False, stream=False)
    return out


async def prewarm(deps: WindowDeps, config: Any, request: Any, ws: WindowSession, window_id: str,
                  first: Mapping[str, Any], head: Mapping[str, Any] | None, db_path: Any, services: Any) -> bool:
    """Pre-warm the window `window_id` opened for `first`; whether the upstream took it."""
    if not config.prompt_cache.prewarm or not supports(first.get("model")):
        return False
    warm = body(first, head)
    if warm is None:
        return False
    timeout = min(TIMEOUT, config.context.checkpoint_timeout_seconds)
    target = checkpoint.TurnTarget(request.url, tuple(request.headers.items(multi=True)), "", timeout,
                                   config.limits.max_body_bytes)
    answer = await checkpoint.send_turn(deps, target, warm)
    if answer is None:
        log.info("context: the new window's prefix was not pre-warmed (the upstream did not take it)")
        return False
    seen = cache_stats.seen_of(answer.get("usage"), None, prewarm=True)
    if seen is not None:
        cache_stats.STATS.observe(services, db_path, ws.key, window_id, ws.task_id, ws.address, seen)
    return True
