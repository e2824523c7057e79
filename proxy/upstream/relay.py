"""The credential hand-over to the tool server (issue 15): MCP and REST calls of image generation and sidecar
search use the credentials of their session's most recent request through the proxy.

The guard offers each request it lets through with credentials (`offer`); when a session's credentials
or route differ from what was last handed over, they are sent once, in the background, to the tool
server's write-only `PUT /v1/credentials` on loopback (bearer token), through the transport seam of the
upstream-turn service. Only what the guard cleared is offered: the request's own destination, an official
endpoint of the credential's kind or an upstream the user trusted; never an untrusted one. What was last
sent is remembered as a salted hash, not the credential. Nothing is written or logged but counts.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

import orjson

from proxy.upstream.transport import AiohttpTransport, Transport, UpstreamBroken, UpstreamRequest, UpstreamUnavailable

log = logging.getLogger("ctproxy.relay")

HANDED_OVER = frozenset({"authorization", "chatgpt-account-id", "openai-organization", "openai-project"})
MAX_REMEMBERED = 4096


@dataclass(frozen=True)
class Offer:
    task: str
    agent: str | None
    base_url: str  # the request's destination up to its API prefix (…/v1, …/backend-api/codex)
    route_kind: str  # api | codex
    official: bool
    headers: dict[str, str] = field(repr=False)
    # Why nothing may be handed over (the session's latest credential was refused for its route), so a
    # tool's error can say what would help: "sign_in_to_gateway". None: `headers` are the credentials.
    refused: str | None = None

    def body(self) -> bytes:
        up = {"base_url": self.base_url, "route_kind": self.route_kind, "official": self.official,
              "credentials_allowed": self.refused is None, "headers": self.headers if self.refused is None else {}}
        return orjson.dumps({"task": self.task, "agent": self.agent, "upstream": up,
                             **({"refused": self.refused} if self.refused else {})})


def base_url_of(scheme: str, host: str, port: int, path: str) -> tuple[str, str] | None:
    """(base URL, route kind) of a request: its origin and path up to `/v1` or `/backend-api/codex`."""
    p = path.split("?", 1)[0]
    for prefix, kind in (("/backend-api/codex/", "codex"), ("/v1/", "api")):
        at = p.find(prefix)
        if at >= 0:
            default = 443 if scheme == "https" else 80
            netloc = host if port == default else f"{host}:{port}"
            if ":" in host and not host.startswith("["):
                netloc = f"[{host}]" if port == default else f"[{host}]:{port}"
            return f"{scheme}://{netloc}{p[:at + len(prefix) - 1]}", kind
    return None


def offer_of(task: str | None, agent: str | None, scheme: str, host: str, port: int, path: str,
             headers: Mapping[str, str], official: bool, refused: str | None = None) -> Offer | None:
    """What a cleared request hands over, or None (no task, no Authorization, no Responses route). `refused`:
    the request's credential was refused for its route; only that is handed over (no credential)."""
    if not task:
        return None
    used = {} if refused else {k.lower(): v for k, v in headers.items() if k.lower() in HANDED_OVER and v}
    if "authorization" not in used and not refused:
        return None
    base = base_url_of(scheme, host, port, path)
    if base is None:
        return None
    return Offer(task, agent, base[0], base[1], official, used, refused)


class CredentialRelay:
    """One per proxy process (kept by the guard). `tools_url` empty: no tool server, nothing is sent."""

    def __init__(self, tools_url: str, token: str, transport: Transport | None = None):
        self.tools_url = tools_url.rstrip("/")
        self._token = token
        self._transport = transport or AiohttpTransport(connect_timeout=5.0)
        self._sent: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.handed_over = 0  # counts, for tests and debug
        self.failed = 0

    @staticmethod
    def _digest(offer: Offer) -> int:
        # str hashes are salted per process (PYTHONHASHSEED): cheap (the guard calls this on every model
        # request with credentials) and meaningless outside this process; a collision only delays a hand-over.
        return hash((offer.base_url, offer.route_kind, offer.official, tuple(sorted(offer.headers.items())),
                     offer.refused))

    def offer(self, offer: Offer) -> bool:
        """Schedule the hand-over when this session's credentials or route changed; True if scheduled."""
        if not self.tools_url:
            return False
        key = (offer.task, offer.agent or "/root")
        digest = self._digest(offer)
        if self._sent.get(key) == digest:
            self._sent.move_to_end(key)
            return False
        self._sent[key] = digest
        self._sent.move_to_end(key)
        while len(self._sent) > MAX_REMEMBERED:
            self._sent.popitem(last=False)
        try:
            task = asyncio.get_running_loop().create_task(self._send(key, digest, offer))
        except RuntimeError:  # no loop (a synchronous unit test): nothing can be sent
            del self._sent[key]
            return False
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _send(self, key: tuple[str, str], digest: int, offer: Offer) -> None:
        request = UpstreamRequest("PUT", self.tools_url + "/v1/credentials",
                                  (("authorization", f"Bearer {self._token}"), ("content-type", "application/json")),
                                  offer.body(), True)
        status = 0
        try:
            async with self._transport.open(request, 10.0) as answer:
                status = answer.status
                async for _ in answer.chunks:
                    pass
        except (UpstreamUnavailable, UpstreamBroken) as exc:
            log.info("credential hand-over to the tool server failed: %s", type(exc).__name__)
        if status == 204:
            self.handed_over += 1
            return
        self.failed += 1
        if status:
            log.info("credential hand-over to the tool server refused: HTTP %d", status)
        if self._sent.get(key) == digest:
            del self._sent[key]  # the next request offers it again

    async def drain(self) -> None:
        """Wait for the hand-overs in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        try:
            async with asyncio.timeout(5.0):
                await self.drain()
        except TimeoutError:
            for task in list(self._tasks):
                task.cancel()
        await self._transport.close()
