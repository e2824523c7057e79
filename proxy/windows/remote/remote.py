"""The remote compaction calls: Codex v2 (streamed `compaction_trigger` turn) and the API's
`POST /v1/responses/compact`. Credentials of the request being served go only to the matching
endpoint of the same destination, and only when that destination may receive them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.items.sse import SSEDecoder
from proxy.routes import CREDENTIAL_HEADERS
from proxy.upstream import UpstreamBroken, UpstreamTurns, UpstreamUnavailable
from proxy.upstream.transport import Answer
from proxy.windows.remote.protocol import (
    BETA_HEADER,
    CompactionFailure,
    RemoteResult,
    V2Collector,
    beta_features,
    parse_v1,
)

# Request headers carried over to the compaction call besides credentials: client identity and the
# Codex session headers that route the turn to the same backend state.
_PASS_HEADERS = frozenset({
    "user-agent", "originator", "version", "session-id", "session_id", "thread-id", "conversation_id",
    "x-codex-installation-id", "x-codex-window-id", "x-codex-turn-state", "x-openai-internal-codex-residency",
    BETA_HEADER,
})
# Credential headers a compaction call may carry (never a proxy's own or a cookie jar).
_CALL_CREDENTIALS = CREDENTIAL_HEADERS - {"proxy-authorization", "cookie"}


@dataclass(frozen=True)
class Target:
    kind: str  # api | codex
    url: str
    headers: dict[str, str]
    credentials_allowed: bool = False  # the destination may receive the served request's credentials


def compaction_target(kind: str, scheme: str, host: str, port: int, path: str, request_headers: Mapping[str, str],
                      credentials_allowed: bool, gateway_key: str | None = None) -> Target | None:
    """The compaction endpoint next to the served `…/responses` request, or None if there is none.
    `gateway_key`: a trusted gateway's own key (`routes.gateway_key`), for a served request that carries no
    credential the gateway may receive: the call carries it as the guard gives it to the agent's turns."""
    p = path.split("?", 1)[0].rstrip("/")
    if not p.endswith("/responses"):
        return None
    default = 443 if scheme == "https" else 80
    netloc = host if port == default else f"{host}:{port}"
    if ":" in host and not host.startswith("["):
        netloc = f"[{host}]" if port == default else f"[{host}]:{port}"
    url = f"{scheme}://{netloc}{p}" + ("" if kind == "codex" else "/compact")
    headers: dict[str, str] = {"content-type": "application/json", "accept-encoding": "identity"}
    for name, value in request_headers.items():
        low = name.lower()
        if low in _PASS_HEADERS or (credentials_allowed and low in _CALL_CREDENTIALS):
            headers[low] = value
    if gateway_key is not None and not credentials_allowed:
        headers["authorization"], credentials_allowed = f"Bearer {gateway_key}", True
    if kind == "codex":
        headers["accept"] = "text/event-stream"
        headers[BETA_HEADER] = beta_features(headers.get(BETA_HEADER))
    else:
        headers["accept"] = "application/json"
        headers.pop(BETA_HEADER, None)
    return Target(kind, url, headers, credentials_allowed)


async def run_compaction(turns: UpstreamTurns, target: Target, body: dict[str, Any],
                         timeout: float) -> RemoteResult:
    """One attempt through the upstream-turn service, no retries (a failure goes to the readable
    fallback instead)."""
    request = turns.prepare("POST", target.url, target.headers, orjson.dumps(body), target.credentials_allowed)
    try:
        async with asyncio.timeout(timeout), turns.stream(request) as resp:
            if target.kind == "codex":
                return await _read_v2(resp)
            try:
                raw = await _read_all(resp)
            except UpstreamBroken:
                raise CompactionFailure("connection") from None
            try:
                parsed = orjson.loads(raw) if raw else None
            except orjson.JSONDecodeError:
                category = f"http_{resp.status}" if resp.status >= 400 else "malformed_response"
                raise CompactionFailure(category) from None
            return parse_v1(resp.status, parsed)
    except TimeoutError:
        raise CompactionFailure("timeout") from None
    except UpstreamUnavailable as exc:
        raise CompactionFailure(exc.category) from None


async def _read_all(resp: Answer) -> bytes:
    return b"".join([chunk async for chunk in resp.chunks])


async def _read_v2(resp: Answer) -> RemoteResult:
    ctype = resp.header("content-type").lower()
    if resp.status >= 400 or not ctype.startswith("text/event-stream"):
        try:
            raw = await _read_all(resp)
        except UpstreamBroken:
            raw = b""
        try:
            parsed = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            parsed = None
        err = parsed.get("error") if isinstance(parsed, dict) else None
        code = err.get("code") if isinstance(err, dict) else None
        if resp.status < 400:
            raise CompactionFailure("malformed_response")
        raise CompactionFailure(f"upstream_{code}" if isinstance(code, str) and code.isidentifier()
                                else f"http_{resp.status}")
    decoder = SSEDecoder()
    collector = V2Collector()
    try:
        async for chunk in resp.chunks:
            for ev in decoder.feed(chunk):
                if _feed(collector, ev.data):
                    return collector.result()
    except UpstreamBroken:  # the stream broke off: judged like a stream that ended early
        return collector.result()
    for ev in decoder.close():
        if _feed(collector, ev.data):
            break
    return collector.result()


def _feed(collector: V2Collector, data: str) -> bool:
    if data == "[DONE]":
        return False
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return isinstance(payload, dict) and collector.feed(payload)
