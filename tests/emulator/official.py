"""Where the official hosts answer differently from the gateway route (issue 43 point 5), in one place.

The emulator serves both route prefixes (`/v1` and `/backend-api/codex`) on one address, as a gateway does. Behind
the official-route double (tests/support/official.py) it is reached as `api.openai.com` or `chatgpt.com` (the
Host header), and then each host serves its own prefix only, as the real ones do:

| host             | serves                        | the other prefix                                     |
|------------------|-------------------------------|------------------------------------------------------|
| api.openai.com   | /v1/…                         | /backend-api/codex/… → 404 `Invalid URL` (JSON)      |
| chatgpt.com      | /backend-api/codex/…          | /v1/… → 404 (the live host answers an HTML page)     |

Also different there, and emulated elsewhere in this package: on the Codex route the SSE `response.completed`
carries `output: []` (search.py) and images are at `/backend-api/codex/images/generations` (images.py).

Not emulated (a test that needs them says so and stops short): what Codex asks chatgpt.com for when signed in,
before its first turn: `GET /backend-api/codex/models`, `POST /backend-api/ps/mcp`, its workspace routing
discovery; and HTTP/3 (both live hosts offer it; the emulator speaks HTTP/1.1 over TCP only).
Which of this was verified against the live service: docs/official-route.md.
"""

from __future__ import annotations

OFFICIAL_PREFIX = {"api.openai.com": "/v1/", "chatgpt.com": "/backend-api/codex/"}


def wrong_host(host_header: str | None, path: str) -> bool:
    """True when an official host is asked for the other official route's path (the emulator answers 404)."""
    host = (host_header or "").rsplit(":", 1)[0].lower() if not (host_header or "").startswith("[") else ""
    own = OFFICIAL_PREFIX.get(host)
    if own is None:
        return False  # a gateway address (127.0.0.1:PORT): both prefixes, as before
    return any(path.startswith(p) for p in OFFICIAL_PREFIX.values() if p != own)
