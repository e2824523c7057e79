"""`UpstreamTurns`: send a Responses request upstream and hold or stream its answer; build the next
round of a turn (`continue_turn`). Callers own what the answer means (compaction parses it, overflow
recovery swaps it in); the service owns how it is sent: one transport, credentials only where cleared."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import orjson

from proxy.routes import CREDENTIAL_HEADERS, without_query_credentials
from proxy.upstream.transport import AiohttpTransport, Answer, Transport, UpstreamRequest
from proxy.upstream.ws import SOCKET_TRANSPORT, WS_HEADER, is_socket_turn, is_ws_request

HOP_HEADERS = frozenset({"content-length", "transfer-encoding", "connection", "keep-alive", "host"})


@dataclass(frozen=True)
class HeldAnswer:
    status: int
    headers: list[tuple[str, str]]  # hop-by-hop headers left out
    body: bytes  # as received (still in its Content-Encoding)

    def header(self, name: str) -> str:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), "")


class UpstreamTurns:
    def __init__(self, transport: Transport | None = None):
        self.transport: Transport = transport or AiohttpTransport()

    @staticmethod
    def prepare(method: str, url: str, headers: Sequence[tuple[str, str]] | Mapping[str, str], body: bytes,
                credentials_allowed: bool) -> UpstreamRequest:
        """The request as it will be sent: no hop-by-hop headers, and no credential header unless the
        destination was cleared for them (the one credential rule, applied by the caller, enforced here)."""
        pairs = headers.items() if isinstance(headers, Mapping) else headers
        kept = tuple((k, v) for k, v in pairs if k.lower() not in HOP_HEADERS
                     and (credentials_allowed or k.lower() not in CREDENTIAL_HEADERS))
        if not credentials_allowed:  # nor a key in the query (the same rule, routes.carried_credentials)
            url = without_query_credentials(url)
        return UpstreamRequest(method, url, kept, body, credentials_allowed)

    def route(self, request: UpstreamRequest) -> tuple[UpstreamRequest, Transport]:
        """A create that came over a Responses WebSocket goes back over its connection's upstream socket
        (proxy/upstream/ws.py), whatever stage sends it; everything else over the one HTTP transport, without
        the connection key (a compaction call of such a session, say)."""
        if not is_ws_request(request):
            return request, self.transport
        if is_socket_turn(request):  # not ctproxy's own held turn (the checkpoint turn): that goes over HTTP
            return request, SOCKET_TRANSPORT
        return replace(request, headers=tuple((k, v) for k, v in request.headers if k.lower() != WS_HEADER),
                       body=without_ws_fields(request.body)), self.transport

    @asynccontextmanager
    async def stream(self, request: UpstreamRequest, timeout: float | None = None) -> AsyncIterator[Answer]:
        """The answer with its body as it arrives (an SSE turn read event by event)."""
        request, transport = self.route(request)
        async with transport.open(request, timeout) as answer:
            yield answer

    async def hold(self, request: UpstreamRequest, timeout: float | None = None) -> HeldAnswer:
        """The whole answer, read before returning (a retry that replaces an answer the agent has not
        seen yet). Raises UpstreamUnavailable / UpstreamBroken."""
        request, transport = self.route(request)
        async with transport.open(request, timeout) as answer:
            body = b"".join([chunk async for chunk in answer.chunks])
            headers = [(k, v) for k, v in answer.headers if k.lower() not in HOP_HEADERS]
            return HeldAnswer(answer.status, headers, body)

    async def close(self) -> None:
        await self.transport.close()


WS_ONLY_FIELDS = ("stream_id",)  # the WebSocket create's envelope: not part of `POST /v1/responses`


def without_ws_fields(body: bytes) -> bytes:
    """A WebSocket create's body sent over HTTP (ctproxy's own held turn of such a session): without the fields
    only the WebSocket create has (the API refuses them on `POST /v1/responses`); else the body as it is."""
    if not any(b'"' + name.encode() + b'"' in body for name in WS_ONLY_FIELDS):
        return body
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    if not isinstance(payload, dict) or not any(name in payload for name in WS_ONLY_FIELDS):
        return body
    return orjson.dumps({k: v for k, v in payload.items() if k not in WS_ONLY_FIELDS})


def continue_turn(payload: Mapping[str, Any], output: Sequence[Any], more_input: Sequence[Any],
                  response_id: str | None = None) -> dict[str, Any]:
    """The next round of a turn (a bridged tool's output, a checkpoint instruction): unknown fields kept.
    A stateless request resends its input, then the round's output items, then the new input; a stateful
    one (`previous_response_id`, the round stored upstream) sends only the new input after `response_id`."""
    if payload.get("previous_response_id") and response_id:
        return {**payload, "previous_response_id": response_id, "input": list(more_input)}
    inp = payload.get("input")
    items = [{"role": "user", "content": inp}] if isinstance(inp, str) else list(inp or [])
    return {**payload, "input": [*items, *output, *more_input]}
