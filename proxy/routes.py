"""Routes and the credential boundary (seed 004 §6).

Credentials go only to `https://api.openai.com/v1/…` (API keys) or
`https://chatgpt.com/backend-api/codex/…` (Codex OAuth), after normalisation: https only, port 443,
no userinfo, exact ASCII host names (no look-alikes, no trailing-dot or IDN tricks), no dot segments.
A non-official upstream gets credentials only when the user said `--trust-upstream`.

Kind matches host (seed 004 §6): an API key (any non-JWT bearer, `api-key`, `x-api-key`) goes only to
`api.openai.com/v1/…`; ChatGPT OAuth (a JWT bearer, `chatgpt-account-id`) only to
`chatgpt.com/backend-api/codex/…`. A request mixing both kinds goes to neither. A trusted non-official
upstream (`--trust-upstream`: a gateway or a local emulator) gets API keys only: a request carrying a
ChatGPT sign-in (a JWT bearer or `chatgpt-account-id`) reaches it with no credential at all (issue 31),
and ctproxy's own calls toward it carry none either. A gateway that needs a key of its own gets it from
ctproxy's environment (`CTPROXY_UPSTREAM_API_KEY`, `gateway_key`), never from a sign-in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from proxy.errors import CtproxyError

RouteKind = Literal["api", "codex"]
CredentialKind = Literal["api_key", "chatgpt", "mixed"]

API_HOST = "api.openai.com"
CODEX_HOST = "chatgpt.com"
API_PREFIX = "/v1/"
CODEX_PREFIX = "/backend-api/codex/"
OFFICIAL_UPSTREAMS: dict[RouteKind, str] = {
    "api": "https://api.openai.com",
    "codex": "https://chatgpt.com",
}

# Lower-case names of request headers that carry credentials or account identity.
CREDENTIAL_HEADERS: frozenset[str] = frozenset({
    "authorization",
    "proxy-authorization",
    "chatgpt-account-id",
    "openai-organization",
    "openai-project",
    "cookie",
    "api-key",
    "x-api-key",
})

# Credentials outside the headers, read and stripped by the same rule (seed 004 pipeline defect 2): query
# parameters (Azure's `?api-key=`, `?access_token=` …) and WebSocket subprotocols that carry a key (the
# browser convention of OpenAI's realtime sockets: `openai-insecure-api-key.<key>`, with the organization and
# project beside it). Each is judged as the header that carries the same thing.
CREDENTIAL_QUERY: dict[str, str] = {"api-key": "api-key", "api_key": "api-key", "key": "api-key",
                                    "access_token": "authorization"}
CREDENTIAL_PROTOCOLS: dict[str, str] = {"openai-insecure-api-key.": "authorization",
                                        "openai-organization.": "openai-organization",
                                        "openai-project.": "openai-project"}
PROTOCOL_HEADER = "sec-websocket-protocol"


# The official route each credential kind may go to.
ROUTE_OF_KIND: dict[str, RouteKind] = {"api_key": "api", "chatgpt": "codex"}
KIND_LABEL: dict[str, str] = {"api_key": "an OpenAI API key", "chatgpt": "a ChatGPT sign-in (OAuth) token",
                              "mixed": "an API key together with ChatGPT account headers"}
# header.payload.signature, base64url; every JWT's header starts with `{"` = `eyJ`.
_JWT = re.compile(r"^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$")

Headers = Mapping[str, str] | Iterable[tuple[str, str]]


def _pairs(headers: Headers) -> Iterable[tuple[str, str]]:
    return headers.items() if isinstance(headers, Mapping) else headers


def is_jwt(token: str) -> bool:
    return bool(_JWT.match(token))


def _as_header(name: str, value: str) -> tuple[str, str]:
    return (name, f"Bearer {value}") if name == "authorization" else (name, value)


def query_credentials(target: str) -> list[tuple[str, str]]:
    """The credentials a request path's (or URL's) query carries, as the headers that would carry them."""
    _, sep, query = target.partition("?")
    if not sep:
        return []
    out = []
    for part in query.split("&"):
        name, _, value = part.partition("=")
        header = CREDENTIAL_QUERY.get(unquote(name).lower())
        if header is not None and value:
            out.append(_as_header(header, unquote(value)))
    return out


def without_query_credentials(target: str) -> str:
    """The path (or URL) without its credential query parameters (the rest as it was, in its order)."""
    head, sep, query = target.partition("?")
    if not sep:
        return target
    kept = [p for p in query.split("&") if unquote(p.partition("=")[0]).lower() not in CREDENTIAL_QUERY]
    return f"{head}?{'&'.join(kept)}" if kept else head


def _protocols(value: str) -> list[str]:
    return [p.strip() for p in value.split(",") if p.strip()]


def credential_protocol(protocol: str) -> tuple[str, str] | None:
    """The credential a WebSocket subprotocol carries, as the header that would carry it; None if it is none."""
    low = protocol.lower()
    for prefix, header in CREDENTIAL_PROTOCOLS.items():
        if low.startswith(prefix) and len(protocol) > len(prefix):
            return _as_header(header, protocol[len(prefix):])
    return None


def without_credential_protocols(value: str) -> str:
    """A `Sec-WebSocket-Protocol` value without the subprotocols that carry credentials."""
    return ", ".join(p for p in _protocols(value) if credential_protocol(p) is None)


def carried_credentials(path: str, headers: Headers) -> list[tuple[str, str]]:
    """Every credential a request carries, as headers: its credential headers, what its query and its
    WebSocket subprotocols carry (the one rule judges them all alike)."""
    out: list[tuple[str, str]] = []
    for name, value in _pairs(headers):
        low = name.lower()
        if low in CREDENTIAL_HEADERS:
            out.append((name, value))
        elif low == PROTOCOL_HEADER:
            out.extend(c for p in _protocols(value) if (c := credential_protocol(p)) is not None)
    out.extend(query_credentials(path))
    return out


def carries_credentials(path: str, headers: Headers) -> bool:
    return bool(carried_credentials(path, headers))


def credential_kind(headers: Headers) -> CredentialKind | None:
    """Which kind of OpenAI credential the headers carry (None: none of either kind). Only the shape is
    looked at, never logged: a JWT bearer is ChatGPT OAuth, any other `Authorization` value an API key."""
    api = chatgpt = False
    for name, value in _pairs(headers):
        low = name.lower()
        if low == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() == "bearer" and is_jwt(token.strip()):
                chatgpt = True
            elif value.strip():
                api = True
        elif low in ("api-key", "x-api-key") and value.strip():
            api = True
        elif low == "chatgpt-account-id" and value.strip():
            chatgpt = True
    if api and chatgpt:
        return "mixed"
    return "chatgpt" if chatgpt else "api_key" if api else None


def kind_matches(kind: CredentialKind | None, route: RouteKind | None) -> bool:
    """May credentials of `kind` go to the official route `route`? (No credentials: nothing to refuse.)"""
    return kind is None or (kind != "mixed" and ROUTE_OF_KIND.get(kind) == route)


def kind_of_path(path: str) -> RouteKind | None:
    """Which official API a request path belongs to, by its prefix."""
    p = path.split("?", 1)[0]
    if p.startswith(CODEX_PREFIX) or p == CODEX_PREFIX.rstrip("/"):
        return "codex"
    if p.startswith(API_PREFIX) or p == API_PREFIX.rstrip("/"):
        return "api"
    return None


def _clean_path(path: str) -> bool:
    p = path.split("?", 1)[0]
    decoded = unquote(p)
    if "\\" in decoded or "\x00" in decoded or "//" in p:
        return False
    segments = decoded.split("/")
    return not any(seg in (".", "..") for seg in segments) and "%2f" not in p.lower()


def is_official_destination(scheme: str, host: str, port: int, path: str, userinfo: str = "") -> RouteKind | None:
    """The route kind when (scheme, host, port, path) is exactly an official endpoint, else None."""
    if scheme.lower() != "https" or port != 443 or userinfo:
        return None
    if not host.isascii() or host != host.strip() or host.endswith("."):
        return None
    host = host.lower()
    kind = kind_of_path(path)
    if kind is None or not _clean_path(path):
        return None
    expected = API_HOST if kind == "api" else CODEX_HOST
    return kind if host == expected else None


@dataclass(frozen=True)
class Upstream:
    """Where reverse mode sends requests: `None` origin means the official split by path."""

    origin: str | None = None  # scheme://host[:port]
    prefix: str = ""  # path prefix of a custom upstream, without trailing slash
    trusted: bool = False

    @property
    def official(self) -> bool:
        return self.origin is None

    def describe(self) -> str:
        if self.origin is None:
            return "official (api.openai.com/v1, chatgpt.com/backend-api/codex)"
        trust = "trusted: API keys forwarded" if self.trusted else "untrusted: credentials stripped"
        return f"{self.origin}{self.prefix} ({trust})"


class UpstreamURLError(CtproxyError, ValueError):
    """`--upstream` is not a URL ctproxy can use (a configuration error, not an upstream failure)."""


def parse_upstream(url: str | None, trusted: bool = False) -> Upstream:
    """Validate `--upstream URL`. An official URL is normalised to the official split."""
    if not url:
        return Upstream(None, "", trusted)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UpstreamURLError(f"--upstream must be an http(s) URL with a host, got {url!r}")
    if parts.username or parts.password:
        raise UpstreamURLError("--upstream must not contain credentials (user:pass@)")
    if parts.query or parts.fragment:
        raise UpstreamURLError("--upstream must not have a query or fragment")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname
    prefix = parts.path.rstrip("/")
    # An upstream naming an official endpoint is the official route, whatever the spelling of its path.
    if parts.scheme == "https" and port == 443 and host in (API_HOST, CODEX_HOST) and prefix in (
        "", "/v1", "/backend-api/codex"
    ):
        return Upstream(None, "", trusted)
    default_port = 443 if parts.scheme == "https" else 80
    netloc = host if port == default_port else f"{host}:{port}"
    if ":" in host and not host.startswith("["):
        netloc = f"[{host}]" if port == default_port else f"[{host}]:{port}"
    return Upstream(f"{parts.scheme}://{netloc}", prefix, trusted)


@dataclass(frozen=True)
class Route:
    """What the proxy knows about a request's destination."""

    kind: RouteKind | None  # by path: /v1/… → api, /backend-api/codex/… → codex
    official: bool  # the destination is exactly the official endpoint of `kind`
    trusted: bool  # the user trusts this (non-official) upstream

    @property
    def credentials_allowed(self) -> bool:
        return self.kind is not None and (self.official or self.trusted)

    @property
    def eligible(self) -> bool:
        """Official-route features (native web search, remote compaction) may touch this request."""
        return self.credentials_allowed


def may_receive_credentials(scheme: str, host: str, port: int, path: str, route: Route, reverse: bool,
                            headers: Headers) -> bool:
    """The one credential rule (DESIGN §5): may a request to this destination, as it is now, carry the
    client's credentials? Yes for the official endpoint of its kind, when the credentials in `headers` are
    of the kind that endpoint takes (API key → api.openai.com/v1, ChatGPT OAuth → chatgpt.com/backend-api/
    codex); for another destination only when the user trusted it (`--trust-upstream`), in reverse mode, on
    a Responses route. The guard applies it to the agent's own request; ctproxy's own calls (compaction,
    image generation, sidecar search, the bridge) to theirs. `headers` are the credentials that would be
    sent (the request's headers; what `path`'s query and a WebSocket upgrade's subprotocols carry counts as
    the same headers): the kind is always judged, there is no destination-only form."""
    official = is_official_destination(scheme, host, port, path)
    headers = carried_credentials(path, headers)  # every carrier: headers, query, subprotocols
    if official is not None:
        return kind_matches(credential_kind(headers), official)
    # A gateway the user trusted gets API keys only: a ChatGPT sign-in (its JWT, its chatgpt-account-id)
    # goes to chatgpt.com/backend-api/codex and nowhere else, trusted or not, http or https (seed 004 §6).
    return route.trusted and reverse and route.kind is not None and gateway_may_receive(headers)


def gateway_may_receive(headers: Headers) -> bool:
    """May the credentials in `headers` go to a trusted non-official upstream? Only when they hold no
    ChatGPT sign-in material: no JWT bearer and no chatgpt-account-id (`--trust-upstream` forwards API
    keys only)."""
    return credential_kind(headers) not in ("chatgpt", "mixed")


GATEWAY_KEY_ENV = "CTPROXY_UPSTREAM_API_KEY"


def gateway_key(route: Route, reverse: bool, headers: Headers, env: Mapping[str, str]) -> str | None:
    """The key ctproxy's environment holds for a trusted gateway (`CTPROXY_UPSTREAM_API_KEY`), for a request
    to that gateway that carries no credential the gateway may receive (none, or a ChatGPT sign-in, which
    is taken off); None otherwise. A client's own API key for the gateway is forwarded as it is. Never a
    JWT: a sign-in is not a gateway key."""
    if route.official or not route.trusted or not reverse or route.kind is None:
        return None
    if credential_kind(headers) == "api_key":
        return None
    key = env.get(GATEWAY_KEY_ENV, "").strip()
    return key if key and not is_jwt(key) and key.isprintable() else None


def credential_mismatch(scheme: str, host: str, port: int, path: str, headers: Headers) -> str | None:
    """Why credentials of the wrong kind may not go to this official endpoint (None: no mismatch), in
    words for the client. Names the kind and the route, never a value."""
    official = is_official_destination(scheme, host, port, path)
    kind = credential_kind(carried_credentials(path, headers))
    if official is None or kind_matches(kind, official):
        return None
    assert kind is not None
    where = "https://chatgpt.com/backend-api/codex/…" if official == "codex" else "https://api.openai.com/v1/…"
    if kind == "mixed":
        return (f"ctproxy refused to send {KIND_LABEL[kind]} to {where}: send either an API key (to "
                "api.openai.com/v1) or a ChatGPT sign-in with its chatgpt-account-id "
                "(to chatgpt.com/backend-api/codex)")
    right = "https://api.openai.com/v1/…" if kind == "api_key" else "https://chatgpt.com/backend-api/codex/…"
    return (f"ctproxy refused to send {KIND_LABEL[kind]} to {where}: that kind of credential goes only to "
            f"{right}; point the client at that route or sign in with the kind this route takes")
