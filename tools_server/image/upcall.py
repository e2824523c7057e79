"""One upstream call of a credentialed tool (image generation, sidecar search: both families use it).

Sent once through the upstream-turn service (`proxy/upstream`: one transport seam, no redirects followed)
after the destination was re-validated with the one credential rule; never retried, never sent to another
backend. The call races the tool's cancel signal and a fixed timeout: once dispatched, an abort or a
timeout means the result is unknown, and the tool says so instead of claiming it was cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson

from proxy.upstream import Transport, UpstreamBroken, UpstreamTurns, UpstreamUnavailable
from proxy.upstream.transport import Answer
from tools_server.credentials import Resolved
from tools_server.registry import CallContext, ToolError, clip

log = logging.getLogger("ctproxy.tools")


@dataclass(frozen=True)
class Outcome:
    status: int
    content_type: str
    request_id: str


def upstream_of(ctx: CallContext) -> UpstreamTurns:
    return ctx.services.upstream_turns


async def call_once[T](ctx: CallContext, feature: str, target: Resolved, endpoint: str, body: dict,
                    read: Callable[[Answer], Awaitable[T]], timeout: float, accept: str = "application/json",
                    what: str = "the request") -> tuple[Outcome, T]:
    """POST `body` to `target.url(endpoint)` once and hand the answer to `read`. Raises ToolError with the
    outcome in words (not sent / sent and unknown / refused)."""
    url = target.url(endpoint)
    if not target.cleared_for(url):  # re-validated just before sending (kind matches host)
        raise ToolError(f"{feature}: the credentials found ({target.account}) may not be sent to "
                        f"{urlsplit(url).hostname}; nothing was sent", code="credentials_not_allowed")
    headers = [("content-type", "application/json"), ("accept", accept), *target.headers.items()]
    request = UpstreamTurns.prepare("POST", url, headers, orjson.dumps(body), credentials_allowed=True)
    started = time.perf_counter()
    host = urlsplit(url).hostname

    async def run() -> tuple[Outcome, T]:
        transport: Transport = upstream_of(ctx).transport
        async with transport.open(request, timeout) as answer:
            outcome = Outcome(answer.status, answer.header("content-type"), answer.header("x-request-id"))
            return outcome, await read(answer)

    task = asyncio.ensure_future(asyncio.wait_for(run(), timeout))
    cancel = asyncio.ensure_future(ctx.cancel.wait())
    try:
        done, _ = await asyncio.wait({task, cancel}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        cancel.cancel()
        raise
    cancel.cancel()
    if task not in done:
        task.cancel()
        _log(feature, "aborted", host, None, started)
        raise ToolError(f"{feature}: aborted after {what} was sent; its result is unknown (it may still have "
                        "been carried out and billed); it was not retried", code="result_unknown")
    try:
        outcome, value = task.result()
    except TimeoutError:
        _log(feature, "timeout", host, None, started)
        raise ToolError(f"{feature}: no complete answer within {timeout:g} s after {what} was sent; its result "
                        "is unknown; it was not retried", code="result_unknown") from None
    except UpstreamUnavailable as exc:
        _log(feature, exc.category, host, None, started)
        if exc.category == "timeout":
            raise ToolError(f"{feature}: no answer within {timeout:g} s after {what} was sent; its result is "
                            "unknown; it was not retried", code="result_unknown") from None
        raise ToolError(f"{feature}: could not reach {host} ({exc.category}); {what} was not retried",
                        code="upstream_unavailable") from None
    except UpstreamBroken:
        _log(feature, "broken", host, None, started)
        raise ToolError(f"{feature}: the answer from {host} broke off; the result is unknown; it was not retried",
                        code="result_unknown") from None
    _log(feature, "answered", host, outcome, started)
    return outcome, value


def _log(feature: str, outcome: str, host: str | None, answer: Outcome | None, started: float) -> None:
    # Categories, host, status, request id and time only (seed 004 §8): never headers, body or arguments.
    log.debug("%s upstream outcome=%s host=%s status=%s request_id=%s ms=%.0f", feature, outcome, host,
              answer.status if answer else "-", (answer.request_id or "-") if answer else "-",
              (time.perf_counter() - started) * 1000)


async def read_all(answer: Answer, limit: int) -> bytes:
    out = bytearray()
    async for chunk in answer.chunks:
        out += chunk
        if len(out) > limit:
            raise ToolError(f"the upstream's answer is larger than {limit // (1024 * 1024)} MiB; it was dropped",
                            code="upstream_too_large")
    return bytes(out)


def refusal(feature: str, status: int, body: bytes) -> ToolError:
    """An upstream's non-2xx answer, in words: its status and its error message (clipped)."""
    if 300 <= status < 400:
        return ToolError(f"{feature}: the upstream answered with a redirect (HTTP {status}); redirects are not "
                         "followed and it was not retried", code="upstream_redirect")
    message = ""
    try:
        err = orjson.loads(body).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or err.get("code") or "")
        elif isinstance(err, str):
            message = err
    except (orjson.JSONDecodeError, AttributeError):
        pass
    said = f": {clip(' '.join(message.split()), 300)}" if message else ""
    return ToolError(f"{feature}: the upstream refused the request (HTTP {status}){said}; it was not retried",
                     code="upstream_error", details={"status": status})
