"""The one ordered addon chain (DESIGN §3.1). Each module also loads alone with `mitmdump -s`."""

from __future__ import annotations

from typing import Any


def chain() -> list[Any]:
    from addons.body import BodyWriter
    from addons.guard import Guard
    from addons.routing import Routing
    from addons.session import Session
    from addons.tap import Tap

    return [
        Routing(),  # where the request goes, and its route
        Session(),  # 1 task / agent / session
        Tap(),  # streams answers through; decodes a copy for the later addons
        # 2 history, 3 context, 4 tools, 5 web_search join here as they land
        Guard(),  # 6 credentials only to official endpoints
        BodyWriter(),  # the body is serialized once, at the end
    ]
