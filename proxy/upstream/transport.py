"""The transport seam of the upstream-turn service: send one request, get the status, headers and body
chunks as they arrive. `AiohttpTransport` is the real one; `MemoryTransport` answers from a function,
for tests that need no sockets. Redirects are never followed; bodies are passed as bytes, undecoded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from proxy.errors import UpstreamError
from proxy.upstream import trust


class UpstreamUnavailable(UpstreamError):
    """No answer at all: connection refused or reset, DNS, TLS, or the time ran out before headers."""

    def __init__(self, category: str):
        super().__init__(category)
        self.category = category  # connection | timeout


class UpstreamBroken(UpstreamError):
    """The answer started but its body broke off."""


@dataclass(frozen=True)
class UpstreamRequest:
    method: str
    url: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    credentials_allowed: bool  # the caller's verdict under proxy.routes.may_receive_credentials


@dataclass
class Answer:
    status: int
    headers: list[tuple[str, str]]
    chunks: AsyncIterator[bytes]  # the body as it arrives (raises UpstreamBroken when it breaks off)

    def header(self, name: str) -> str:
        low = name.lower()
        return next((v for k, v in self.headers if k.lower() == low), "")


class Transport(Protocol):
    def open(self, request: UpstreamRequest, timeout: float | None) -> AbstractAsyncContextManager[Answer]:
        """The answer, once its status and headers are in; the connection is closed on leaving it."""
        ...

    async def close(self) -> None: ...


class AiohttpTransport:
    """One aiohttp session for every call of a process (connections reused); no redirects, no decoding."""

    def __init__(self, connect_timeout: float = 30.0):
        self._connect_timeout = connect_timeout
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                auto_decompress=False,
                # One session serves every agent's calls: a cookie one upstream answer set must never ride
                # along on another session's call. Headers the agent sent are passed as they are.
                cookie_jar=aiohttp.DummyCookieJar())
        return self._http

    @asynccontextmanager
    async def open(self, request: UpstreamRequest, timeout: float | None) -> AsyncIterator[Answer]:
        try:
            async with asyncio.timeout(timeout):
                resp = await self._session().request(request.method, request.url, headers=list(request.headers),
                                                     data=request.body, allow_redirects=False,
                                                     ssl=trust.client_ssl())  # --upstream-ca
        except TimeoutError:
            raise UpstreamUnavailable("timeout") from None
        except aiohttp.ClientError:
            raise UpstreamUnavailable("connection") from None
        try:
            yield Answer(resp.status, [(k, v) for k, v in resp.headers.items()], _chunks(resp))
        finally:
            resp.release()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


async def _chunks(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError):
        raise UpstreamBroken() from None


Handler = Callable[[UpstreamRequest], Awaitable[tuple[int, Sequence[tuple[str, str]], Sequence[bytes]]]]


class MemoryTransport:
    """Answers every request from `handler(request) -> (status, headers, body chunks)`; keeps the requests
    it saw (`requests`). A handler that raises UpstreamUnavailable is an upstream that cannot be reached."""

    def __init__(self, handler: Handler):
        self._handler = handler
        self.requests: list[UpstreamRequest] = []

    @asynccontextmanager
    async def open(self, request: UpstreamRequest, timeout: float | None) -> AsyncIterator[Answer]:
        self.requests.append(request)
        try:
            async with asyncio.timeout(timeout):
                status, headers, chunks = await self._handler(request)
        except TimeoutError:
            raise UpstreamUnavailable("timeout") from None

        async def body() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        yield Answer(status, list(headers), body())

    async def close(self) -> None:
        return None
