"""The one ordered addon chain (DESIGN §3.1). Each module also loads alone with `mitmdump -s`."""

from __future__ import annotations

from typing import Any


def chain() -> list[Any]:
    from addons.body import BodyWriter
    from addons.bridge import Bridge
    from addons.codex_backend import CodexBackend
    from addons.compaction import Compaction
    from addons.context import Context
    from addons.guard import Guard
    from addons.history import History
    from addons.requestlog import RequestLog
    from addons.routing import Routing
    from addons.session import Session
    from addons.tap import Tap
    from addons.web_search import WebSearch
    from addons.websocket import WebSocket

    return [
        Routing(),  # where the request goes, and its route
        CodexBackend(),  # Codex's alpha/history|notes backend calls → the tool server
        Session(),  # 1 task / agent / session
        Tap(),  # streams answers through; decodes a copy for the later addons
        History(),  # 2 journal the new input items and the answer's output items
        Compaction(),  # remote compaction v2 / readable fallback: decides, opens windows, overflow recovery
        Context(),  # 3 applies the session's current window (the journal's): bootstrap before its boundary
        Bridge(),  # 4 tools: bridged tool specs; a request offered them is answered by the bridge's endpoint
        WebSearch(),  # 5 native web_search on official routes
        Guard(),  # 6 credentials only to official endpoints
        WebSocket(),  # Responses WebSocket: each response.create runs through this chain; the socket's ends
        BodyWriter(),  # the body is serialized once, at the end
        RequestLog(),  # answers only: one log line, the metrics and the dashboard's feed, once the answer is final
    ]
