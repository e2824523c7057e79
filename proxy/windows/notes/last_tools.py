"""The `tools` and `prompt_cache_key` each session's last request went up with, after every stage (the bridge's
specs, web search, a derived key): the checkpoint turn goes up with exactly these, so that it extends the window's
cached prefix in the same cache bucket (issue 47). The context stage runs before the bridge and web search add
theirs: it cannot rebuild them, it reads them here."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

MAX_SESSIONS = 4096  # sessions remembered (the least recently forwarded forgotten first)


class LastTools:
    def __init__(self, limit: int = MAX_SESSIONS):
        self._by_session: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._limit = limit

    def remember(self, session_key: str, body: dict[str, Any]) -> None:
        # the forwarded values themselves: stages make new lists, never edit one
        head = {k: body[k] for k in ("tools", "prompt_cache_key") if body.get(k) is not None}
        self._by_session[session_key] = head
        self._by_session.move_to_end(session_key)
        while len(self._by_session) > self._limit:
            self._by_session.popitem(last=False)

    def get(self, session_key: str) -> dict[str, Any] | None:
        """`tools` and `prompt_cache_key` as last forwarded (each only when it was there), or None: never seen."""
        return self._by_session.get(session_key)
