"""The errors ctproxy itself produces, in OpenAI's shapes.

Every answer the proxy makes on its own (an unreachable upstream, a timeout, a refused body) is an
OpenAI-style JSON error, so SDKs and agents can read it the way they read upstream errors:

    {"error": {"message": "…", "type": "…", "param": null, "code": "…"}}

and, inside a stream that is already under way, the Responses `error` event
(`{"type": "error", "code": …, "message": …, "param": null, "sequence_number": N}`).
Messages name no address: the proxy's own log line has the host, the agent gets the category.
`x-ctproxy-error: <code>` marks an answer as the proxy's, not the upstream's.
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import orjson

ERROR_HEADER = "x-ctproxy-error"


class CtproxyError(Exception):
    """The one base of every exception ctproxy raises itself (a caller may catch them all at once).
    Classes that mean what a builtin means keep that base too (`AddressError` is a ValueError)."""


class UpstreamError(CtproxyError):
    """Something ctproxy depends on failed on its side: the upstream could not be reached or answered
    something unusable (`UpstreamUnavailable`, `UpstreamBroken`), ctproxy's tool server could not be
    reached (`ToolServerUnreachable`), or a compaction call failed (`CompactionFailure`)."""


class StoreError(CtproxyError, RuntimeError):
    """A shared state store (PostgreSQL, proxy/store/) could not be reached or refused what was asked of it."""


class ProxyError(NamedTuple):
    status: int
    type: str
    code: str
    message: str

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.code)

    def headers(self) -> dict[str, str]:
        return {"content-type": "application/json", ERROR_HEADER: self.code}

    def sse_event(self, sequence_number: int) -> bytes:
        return sse_error_event(self.code, self.message, sequence_number)


def error_body(message: str, type_: str, code: str | None, param: str | None = None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def sse_error_event(code: str, message: str, sequence_number: int) -> bytes:
    """The Responses stream's `error` event (ResponseErrorEvent), one SSE frame."""
    payload = {"type": "error", "code": code, "message": message, "param": None, "sequence_number": sequence_number}
    return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"


def json_response(err: ProxyError):
    """A mitmproxy `http.Response` carrying the error (for `flow.response = …` in a request hook)."""
    from mitmproxy import http

    return http.Response.make(err.status, err.body(), err.headers())


# ---- the errors -------------------------------------------------------------------------------------

def body_too_large(decoded_limit: int, encoding: str, sent: int) -> ProxyError:
    return ProxyError(
        413, "invalid_request_error", "request_body_too_large",
        f"The request body ({sent} bytes as sent, Content-Encoding {encoding}) decompresses to more than "
        f"{decoded_limit} bytes; ctproxy refuses it as a likely decompression bomb. "
        "Raise limits.max_body_bytes in the ctproxy config to accept larger bodies.")


def connect_timeout(seconds: float) -> ProxyError:
    return ProxyError(504, "server_error", "upstream_connect_timeout",
                      f"ctproxy could not connect to the upstream within {seconds:g} s "
                      "(timeouts.connect_seconds).")


def idle_timeout(seconds: float, streaming: bool) -> ProxyError:
    what = "sent nothing more" if streaming else "sent no answer"
    return ProxyError(504, "server_error", "upstream_idle_timeout",
                      f"The upstream {what} for {seconds:g} s; ctproxy closed the upstream connection "
                      "(timeouts.stream_idle_seconds).")


# Substrings of OS / mitmproxy connect errors → a category that names no address.
_CONNECT_CAUSES = (
    ("refused", "connection refused"),
    ("name or service not known", "the upstream host name did not resolve"),
    ("nodename nor servname", "the upstream host name did not resolve"),
    ("temporary failure in name resolution", "the upstream host name did not resolve"),
    ("no address associated", "the upstream host name did not resolve"),
    ("getaddrinfo", "the upstream host name did not resolve"),
    ("network is unreachable", "network unreachable"),
    ("no route to host", "no route to host"),
    ("timed out", "connection timed out"),
    ("certificate", "the upstream's TLS certificate was not accepted (nothing was sent; behind a TLS-inspecting "
                    "proxy or a gateway with a private CA, trust that CA with `ctproxy up --upstream-ca FILE`)"),
    ("tls", "the TLS handshake with the upstream failed"),
    ("ssl", "the TLS handshake with the upstream failed"),
    ("handshake", "the TLS handshake with the upstream failed"),
    ("reset", "connection reset"),
    ("destination unknown", "ctproxy would connect to itself; no upstream is configured for this request"),
)


_ERRNO = re.compile(r"\[errno (\d+)\]")


def connect_failed(detail: str) -> ProxyError:
    low = detail.lower()
    cause = next((text for needle, text in _CONNECT_CAUSES if needle in low), None)
    if cause is None and (m := _ERRNO.search(low)):  # asyncio: "[Errno 111] Connect call failed ('host', port)"
        cause = os.strerror(int(m.group(1))).lower()
    cause = cause or "connection failed"
    return ProxyError(502, "server_error", "upstream_unreachable",
                      f"ctproxy could not connect to the upstream: {cause}.")


def upstream_disconnected() -> ProxyError:
    return ProxyError(502, "server_error", "upstream_disconnected",
                      "The upstream closed the connection before it answered.")


def upstream_invalid() -> ProxyError:
    return ProxyError(502, "server_error", "upstream_invalid_response",
                      "The upstream's answer was not valid HTTP; ctproxy did not forward it.")


def upstream_too_large() -> ProxyError:
    return ProxyError(502, "server_error", "upstream_response_too_large",
                      "The upstream's answer exceeds the proxy's body size limit.")


def request_too_large() -> ProxyError:
    return ProxyError(413, "invalid_request_error", "request_body_too_large",
                      "The request body exceeds the proxy's body size limit.")


def bad_request(detail: str) -> ProxyError:
    # mitmproxy's own wording about the client's request (it quotes the client's bytes, never an address
    # of ours); kept short.
    text = " ".join(detail.split())[:200] or "malformed request"
    return ProxyError(400, "invalid_request_error", "invalid_request", f"ctproxy could not read the request: {text}")


def proxy_error(status: int, detail: str) -> ProxyError:
    """mitmproxy's error for an HTTP status it would have answered with an HTML page."""
    if status == 413:
        return request_too_large()
    if 400 <= status < 500:
        return bad_request(detail)
    return ProxyError(status, "server_error", "proxy_error", "ctproxy could not complete the request.")
