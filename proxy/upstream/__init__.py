"""The upstream-turn service: the only way ctproxy talks to an upstream on its own initiative (DESIGN §2).

mitmproxy forwards the agent's own request; everything else ctproxy sends — compaction calls, overflow
retries, and next the bridged rounds, the checkpoint turn, sidecar search and image generation — goes
through `UpstreamTurns`, over one transport seam (`Transport`: aiohttp in the proxy, in memory in tests)
and one credential rule (`proxy.routes.may_receive_credentials`, decided by the caller for the
destination; the service strips credential headers from any request not cleared for them).
"""

from proxy.upstream.service import HeldAnswer, UpstreamTurns, continue_turn
from proxy.upstream.transport import (
    AiohttpTransport,
    MemoryTransport,
    Transport,
    UpstreamBroken,
    UpstreamRequest,
    UpstreamUnavailable,
)
from proxy.upstream.ws import WS_HEADER, SocketRefused, UpstreamSocket, open_socket

__all__ = [
    "WS_HEADER",
    "AiohttpTransport",
    "HeldAnswer",
    "MemoryTransport",
    "SocketRefused",
    "Transport",
    "UpstreamBroken",
    "UpstreamRequest",
    "UpstreamSocket",
    "UpstreamTurns",
    "UpstreamUnavailable",
    "continue_turn",
    "open_socket",
]
