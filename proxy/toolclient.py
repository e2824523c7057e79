"""The proxy's client of its own tool server (the bridge endpoint, tools_server/bridge.py).

The tool server is a separate process (DESIGN §2, ADR 0002), on loopback, behind its bearer token (the
state directory's `token` file). It is not an upstream: nothing here ever leaves the machine, which is
why this module, and not only the upstream-turn service, may hold an HTTP client (pyproject.toml's
import-linter contract says so). Arguments, outputs and the credentials of a call are never logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from proxy.errors import UpstreamError


class ToolServerUnreachable(UpstreamError):
    """The tool server did not answer (not running, wrong token, a broken connection)."""


@dataclass(frozen=True)
class BridgeTool:
    """One registry entry as the bridge sees it (GET /v1/bridge/specs)."""

    name: str
    family: str
    capability: str
    parallel: bool
    available: bool
    reason: str
    function: Mapping[str, Any]
    custom: Mapping[str, Any] | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BridgeTool:
        return cls(name=str(d["name"]), family=str(d.get("family", "")), capability=str(d.get("capability", "")),
                   parallel=bool(d.get("parallel", True)), available=bool(d.get("available", True)),
                   reason=str(d.get("reason") or ""), function=d["function"], custom=d.get("custom"))


@dataclass(frozen=True)
class CallerUpstream:
    """The route and credentials of the agent request a call came from: for this one call, in memory."""

    base_url: str
    route_kind: str | None
    official: bool
    credentials_allowed: bool
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class ToolCall:
    name: str
    kind: str  # "function" | "custom"
    text: str  # the function call's raw arguments, or the custom call's input
    call_id: str | None = None
    task: str | None = None
    agent: str | None = None
    session: str | None = None
    cwd: str | None = None
    upstream: CallerUpstream | None = field(default=None, repr=False)

    def body(self) -> bytes:
        d: dict[str, Any] = {"name": self.name, "kind": self.kind, "call_id": self.call_id, "task": self.task,
                             "agent": self.agent, "session": self.session, "cwd": self.cwd}
        d["arguments" if self.kind == "function" else "input"] = self.text
        if self.upstream is not None:
            u = self.upstream
            d["upstream"] = {"base_url": u.base_url, "route_kind": u.route_kind, "official": u.official,
                             "credentials_allowed": u.credentials_allowed,
                             "headers": dict(u.headers) if u.credentials_allowed else {}}
        return orjson.dumps(d)


@dataclass(frozen=True)
class ToolImage:
    """An image a tool returned (`openai_generate_image`, `computer_use_get_app_state`)."""

    mime_type: str
    data: str = field(repr=False)  # base64

    def data_url(self) -> str:
        return f"data:{self.mime_type};base64,{self.data}"


@dataclass(frozen=True)
class CallOutcome:
    output: str
    is_error: bool
    error: str | None = None
    images: tuple[ToolImage, ...] = ()
    carried: frozenset[str] | None = None  # tool discovery on: what the caller's next round carries


def _carried(value: Any) -> frozenset[str] | None:
    return frozenset(str(n) for n in value) if isinstance(value, list) else None


def _images(value: Any) -> tuple[ToolImage, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(ToolImage(str(i["mime_type"]), str(i["data"])) for i in value
                 if isinstance(i, Mapping) and isinstance(i.get("mime_type"), str) and isinstance(i.get("data"), str))


class ToolClient:
    def __init__(self, url: str, token: str, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {token}"}
        self._timeout = timeout
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))
        return self._http

    async def specs(self) -> list[BridgeTool]:
        try:
            async with self._session().get(self.url + "/v1/bridge/specs", headers=self._auth,
                                           timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    raise ToolServerUnreachable(f"HTTP {resp.status}")
                data = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise ToolServerUnreachable(type(exc).__name__) from None
        return [BridgeTool.from_json(d) for d in data.get("data", [])]

    async def carried(self, session: str | None, task: str | None, agent: str | None) -> frozenset[str] | None:
        """The tool names a bridged request of this caller carries under tool discovery (None: discovery
        is off on the tool server, every available tool may be offered)."""
        query = {"only": "carried", "session": session or "", "task": task or "", "agent": agent or ""}
        try:
            async with self._session().get(self.url + "/v1/bridge/specs", headers=self._auth, params=query,
                                           timeout=aiohttp.ClientTimeout(total=10)) as resp:
                if resp.status != 200:
                    raise ToolServerUnreachable(f"HTTP {resp.status}")
                data = orjson.loads(await resp.read())
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise ToolServerUnreachable(type(exc).__name__) from None
        return _carried(data.get("carried"))

    async def call(self, call: ToolCall) -> CallOutcome:
        """Raises ToolServerUnreachable when there is no answer (the call's effect is then unknown)."""
        try:
            async with self._session().post(self.url + "/v1/bridge/call", data=call.body(),
                                            headers={**self._auth, "Content-Type": "application/json"},
                                            timeout=aiohttp.ClientTimeout(total=self._timeout)) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise ToolServerUnreachable(f"HTTP {resp.status}")
                data = orjson.loads(raw)
        except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError) as exc:
            raise ToolServerUnreachable(type(exc).__name__) from None
        return CallOutcome(str(data.get("output", "")), bool(data.get("is_error")), data.get("error"),
                           _images(data.get("images")), _carried(data.get("carried")))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
