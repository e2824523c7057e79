"""The `tools` each session's last request went up with, after every stage (the bridge's specs, web search):
the checkpoint turn offers exactly these, so that it extends the window's cached prefix (issue 47). Runs before
the bridge and web search add theirs, the context stage cannot rebuild them; it reads them here."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

MAX_SESSIONS = 4096  # sessions remembered (the least recently forwarded forgotten first)


class LastTools:
    def __init__(self, limit: int = MAX_SESSIONS):
        self._by_session: OrderedDict[str, list[Any]] = OrderedDict()
        self._limit = limit

    def remember(self, session_key: str, tools: Any) -> None:
        if not isinstance(tools, list):
            self._by_session.pop(session_key, None)
            return
        self._by_session[session_key] = tools  # the forwarded list itself: stages make new lists, never edit one
        self._by_session.move_to_end(session_key)
        while len(self._by_session) > self._limit:
            self._by_session.popitem(last=False)

    def get(self, session_key: str) -> list[Any] | None:
        return self._by_session.get(session_key)
