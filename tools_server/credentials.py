"""Where the credentialed tools (image generation, sidecar search) get their credentials and route.

Resolved fresh before each dispatch, in this order (issue 15):
1. a bridged call: `CallContext.upstream`, the route and credentials of the agent request that produced
   it (the proxy's bridge fills it for that one call);
2. an MCP/REST call: the credentials of that session's (x-ctp-task + x-ctp-agent) most recent request
   through the proxy, which the proxy hands over with `PUT /v1/credentials` (below);
3. `OPENAI_API_KEY` in ctproxy's environment, for https://api.openai.com/v1;
nothing → a tool error saying what to configure. The destination is re-validated with the one
credential rule (`proxy.routes.may_receive_credentials`, kind matches host) just before sending.

Why the hand-over is safe (docs/credentials.md): `PUT /v1/credentials` is write-only (no route reads a
credential back), behind the tool server's loopback listener and bearer token; the proxy sends only what
the guard let through to that request's own destination (an official endpoint of the credential's kind,
or an upstream the user trusted), and the tools send them only to that same base URL. Entries live in
this process's memory (bounded, expiring), are never written, and `repr` never shows them.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy import routes
from proxy.errors import CtproxyError

Source = Literal["bridge", "session", "environment"]
ENV_KEY = "OPENAI_API_KEY"
ENV_BASE_URL = "https://api.openai.com/v1"
# Only these of the agent's headers are handed over and used: the credential and the account/org it names.
USED_HEADERS = frozenset({"authorization", "chatgpt-account-id", "openai-organization", "openai-project"})
MAX_SESSIONS = 1024
MAX_AGE_SECONDS = 12 * 3600  # a token this old is likely refreshed by now; the next request brings the new one


class CredentialsMissing(CtproxyError):
    """Nothing to call upstream with; the message says what to configure."""


@dataclass(frozen=True)
class Resolved:
    """What one dispatch uses. `headers` holds the credential: never logged (`repr=False`)."""

    base_url: str  # …/v1 or …/backend-api/codex
    route_kind: routes.RouteKind  # api: JSON answers; codex: the ChatGPT backend (SSE for Responses)
    official: bool
    source: Source
    credential: routes.CredentialKind | None
    headers: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def account(self) -> str:
        """The account kind, as the user reads it (status, results)."""
        return {"api_key": "API key", "chatgpt": "ChatGPT sign-in"}.get(self.credential or "", "no credential")

    def url(self, endpoint: str) -> str:
        return self.base_url.rstrip("/") + "/" + endpoint.lstrip("/")

    def cleared_for(self, url: str) -> bool:
        """The one credential rule, applied to `url` as it will be sent (kind matches host)."""
        parts = urlsplit(url)
        if not parts.hostname or parts.username or parts.password:
            return False
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if not url.startswith(self.base_url.rstrip("/") + "/"):
            return False  # only endpoints under the base the credentials already went to
        # A trusted upstream may have a path prefix (`--upstream http://gw/prefix`): its kind is the hand-over's.
        kind = routes.kind_of_path(parts.path) if self.official else self.route_kind
        route = routes.Route(kind=kind, official=self.official, trusted=not self.official)
        if self.official and routes.is_official_destination(parts.scheme, parts.hostname, port, parts.path) is None:
            return False
        # `reverse=True`: a trusted upstream is the one the proxy forwards to in reverse mode.
        return routes.may_receive_credentials(parts.scheme, parts.hostname, port, parts.path, route, True,
                                              self.headers)


def _used(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() in USED_HEADERS and v}


@dataclass(frozen=True)
class UpstreamAccess:
    """The route and credentials of the agent request a bridged call came from (tools that call an upstream
    themselves: image generation, sidecar search). Held in memory for that one call only; never logged
    (`repr` hides the headers). `headers` is empty unless the route may receive credentials
    (proxy.routes.may_receive_credentials, decided by the proxy)."""

    base_url: str  # where the agent's request went, up to and including the API prefix (…/v1, …/codex)
    route_kind: str | None  # proxy.routes.Route.kind: "api" | "codex" | None
    official: bool
    credentials_allowed: bool
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    refused: str | None = None  # the session's latest credential was refused for this route (none held)



def from_access(access: UpstreamAccess, source: Source) -> Resolved | None:
    """An agent request's route and credentials as a dispatch target; None when they may not be used."""
    if not access.credentials_allowed or access.route_kind not in ("api", "codex"):
        return None
    headers = _used(access.headers)
    if "authorization" not in headers:
        return None
    kind = routes.credential_kind(headers)
    if access.official and not routes.kind_matches(kind, access.route_kind):  # type: ignore[arg-type]
        return None
    if not access.official and not routes.gateway_may_receive(headers):
        return None  # a ChatGPT sign-in never goes to a gateway, trusted or not (seed 004 §6)
    return Resolved(access.base_url, access.route_kind, access.official, source, kind,  # type: ignore[arg-type]
                    headers)


def session_key(task: str | None, agent: str | None) -> tuple[str, str] | None:
    return (task, agent or "/root") if task else None


class SessionCredentials:
    """Each session's most recent credentials, in memory only (least recently handed over dropped first)."""

    def __init__(self, max_sessions: int = MAX_SESSIONS, max_age: float = MAX_AGE_SECONDS):
        self._entries: OrderedDict[tuple[str, str], tuple[float, UpstreamAccess]] = OrderedDict()
        self._max = max_sessions
        self._max_age = max_age

    def __repr__(self) -> str:
        return f"SessionCredentials({len(self._entries)} sessions)"

    def put(self, task: str, agent: str | None, access: UpstreamAccess) -> None:
        key = (task, agent or "/root")
        self._entries[key] = (time.monotonic(), access)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def get(self, task: str | None, agent: str | None) -> UpstreamAccess | None:
        key = session_key(task, agent)
        if key is None or (entry := self._entries.get(key)) is None:
            return None
        at, access = entry
        if time.monotonic() - at > self._max_age:
            del self._entries[key]
            return None
        return access

    def __len__(self) -> int:
        return len(self._entries)


class _HasSessionCredentials(Protocol):
    @property
    def session_credentials(self) -> SessionCredentials: ...


class Caller(Protocol):
    """What `resolve` reads of a call: tools_server.registry.CallContext (a Protocol, so the registry can
    import this module without a loop)."""

    @property
    def services(self) -> _HasSessionCredentials: ...
    @property
    def upstream(self) -> UpstreamAccess | None: ...
    @property
    def task(self) -> str | None: ...
    @property
    def agent(self) -> str | None: ...


def resolve(ctx: Caller, env: dict[str, str] | None = None) -> Resolved:
    """The credentials for this dispatch (module docstring); raises CredentialsMissing."""
    if ctx.upstream is not None and (r := from_access(ctx.upstream, "bridge")) is not None:
        return r
    access = ctx.services.session_credentials.get(ctx.task, ctx.agent)
    if access is not None and (r := from_access(access, "session")) is not None:
        return r
    key = (os.environ if env is None else env).get(ENV_KEY, "").strip()
    if key:
        headers = {"authorization": f"Bearer {key}"}
        if routes.credential_kind(headers) == "api_key":
            return Resolved(ENV_BASE_URL, "api", True, "environment", "api_key", headers)
    if access is not None and access.refused == "sign_in_to_gateway":
        raise CredentialsMissing(
            "no OpenAI credentials for this call: this session's model requests sign in with ChatGPT, and their "
            "upstream is a trusted gateway (--trust-upstream), where a sign-in never goes; set "
            "CTPROXY_UPSTREAM_API_KEY (the gateway's own key) or OPENAI_API_KEY (an API key, used with "
            "https://api.openai.com/v1) in ctproxy's environment")
    if ctx.task is None:
        hint = ("send x-ctp-task (and x-ctp-agent) with this call, the same as on the agent's model requests "
                "through ctproxy, ")
    else:
        hint = "make a model request through ctproxy with the same x-ctp-task/x-ctp-agent first, "
    raise CredentialsMissing(f"no OpenAI credentials for this call: {hint}or set {ENV_KEY} in ctproxy's "
                             "environment (an API key; used with https://api.openai.com/v1)")


# ---- the proxy's hand-over: PUT /v1/credentials ----------------------------------------------------------


class _Upstream(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str = Field(max_length=2000)
    route_kind: Literal["api", "codex"]
    official: bool
    credentials_allowed: bool
    headers: dict[str, str] = Field(default_factory=dict, repr=False)


class Handover(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: str = Field(min_length=1, max_length=500)
    agent: str | None = Field(None, max_length=500)
    upstream: _Upstream
    # the session's latest credential was refused for its route (nothing handed over): its tools say why
    refused: Literal["sign_in_to_gateway"] | None = None


def _refuse(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def add_routes(app: web.Application, store_of: Callable[[web.Application], SessionCredentials]) -> None:
    """`PUT /v1/credentials` (write-only: there is no GET). `store_of(app)` gives the SessionCredentials."""
    async def put(request: web.Request) -> web.Response:
        try:
            body = Handover.model_validate_json(await request.read())
        except (ValidationError, ValueError):
            # never echo the body: it holds a credential
            return _refuse(400, "invalid_credentials", "the body must be {task, agent?, upstream{…}}")
        up = body.upstream
        if body.refused is not None:
            store_of(request.app).put(body.task, body.agent, UpstreamAccess(
                up.base_url, up.route_kind, up.official, False, {}, refused=body.refused))
            return web.Response(status=204)
        access = UpstreamAccess(up.base_url, up.route_kind, up.official, up.credentials_allowed, dict(up.headers))
        if from_access(access, "session") is None or not _base_ok(up.base_url, up.official):
            return _refuse(400, "credentials_not_usable",
                           "these credentials may not go to that route (kind matches host, official or trusted)")
        store_of(request.app).put(body.task, body.agent, access)
        return web.Response(status=204)

    app.router.add_put("/v1/credentials", put)


def _base_ok(base_url: str, official: bool) -> bool:
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.query:
        return False
    if official:
        port = parts.port or 443
        return routes.is_official_destination(parts.scheme, parts.hostname, port, parts.path.rstrip("/") + "/") \
            is not None
    return True
