"""`ctproxy replay FILE.mitm`: run the addon chain over recorded flows offline and show, per flow,
what each addon changed in the request (a readable diff of the body and the headers).

Nothing is sent anywhere. By default a throw-away state directory is used, so replaying does not
write into the real journal. Without `--upstream`, the chain runs with the upstream the flows were
recorded against (`ctproxy up --record` names it on each flow), so a recording made against a local
emulator replays as it ran, not as if it had gone to api.openai.com.

Also here: what `ctproxy up --server-replay` hands to mitmproxy (`server_replay_file`), and the check
that a file is a recording at all (`count_flows`).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from mitmproxy import exceptions, http, io

from proxy.errors import CtproxyError
from proxy.host.flowstate import state_of

UPSTREAM_KEY = "ctp.upstream"  # the --upstream the flow was recorded with ("" = the official endpoints)
TRUST_KEY = "ctp.trust_upstream"
MODE_KEY = "ctp.mode"  # reverse | regular


class NotAFlowFile(CtproxyError, ValueError):
    """The file is not a mitmproxy recording (the message says what to do)."""


def count_flows(path: Path) -> int:
    """How many HTTP flows a recording holds; NotAFlowFile if it is not one."""
    hint = "record one with `ctproxy up --record FILE.mitm`"
    try:
        with path.open("rb") as fh:
            return sum(1 for f in io.FlowReader(fh).stream() if isinstance(f, http.HTTPFlow))
    except FileNotFoundError:
        raise NotAFlowFile(f"{path} does not exist; {hint}") from None
    except IsADirectoryError:
        raise NotAFlowFile(f"{path} is a directory, not a mitmproxy flow file; {hint}") from None
    except OSError as exc:
        raise NotAFlowFile(f"cannot read {path}: {exc.strerror or exc}") from None
    except (exceptions.FlowReadException, ValueError, TypeError, KeyError, IndexError) as exc:
        reason = str(exc).rstrip(".") or type(exc).__name__
        raise NotAFlowFile(f"{path} is not a mitmproxy flow file ({reason}); {hint}") from None


class RecordUpstream:
    """`ctproxy up --record`: names the upstream on every flow (flow metadata, kept in the file), so
    `ctproxy replay` can run the chain as it ran. Placed before the recorder in the launcher's chain."""

    def __init__(self, upstream: str | None, trusted: bool, mode: str):
        from proxy.routes import parse_upstream

        up = parse_upstream(upstream, trusted)
        self.values = {UPSTREAM_KEY: "" if up.origin is None else f"{up.origin}{up.prefix}",
                       TRUST_KEY: bool(trusted), MODE_KEY: mode}

    def _stamp(self, flow: http.HTTPFlow) -> None:
        flow.metadata.update(self.values)

    def response(self, flow: http.HTTPFlow) -> None:
        self._stamp(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._stamp(flow)


@dataclass(frozen=True)
class RecordedUpstream:
    url: str | None  # None: the official endpoints
    trusted: bool
    mode: str
    named: bool  # False: an older recording; guessed from where its requests went


def recorded_upstream(path: Path) -> RecordedUpstream | None:
    """The upstream a recording was made against: from the flows' metadata, else (older recordings) from
    where the first request went — reverse mode rewrote it to the upstream — with trust guessed from
    whether credentials reached it (the guard strips them for an untrusted upstream; the file redacts them)."""
    from proxy.routes import CREDENTIAL_HEADERS, parse_upstream

    first: http.HTTPFlow | None = None
    for flow in read_flows(path):
        if UPSTREAM_KEY in flow.metadata:
            return RecordedUpstream(flow.metadata[UPSTREAM_KEY] or None, bool(flow.metadata.get(TRUST_KEY)),
                                    str(flow.metadata.get(MODE_KEY) or "reverse"), True)
        first = first or flow
    if first is None:
        return None
    req = first.request
    default_port = 443 if req.scheme == "https" else 80
    origin = f"{req.scheme}://{req.host}" + ("" if req.port == default_port else f":{req.port}")
    try:
        up = parse_upstream(origin)
    except ValueError:
        return None
    trusted = any(k.lower() in CREDENTIAL_HEADERS for k in req.headers)
    return RecordedUpstream(up.origin, trusted and up.origin is not None, "reverse", False)


def replay_header(recorded: RecordedUpstream | None, upstream: str | None, trusted: bool) -> str:
    """The first line `ctproxy replay` prints: which upstream the chain runs with, and why."""
    from proxy.routes import parse_upstream

    if upstream:
        line = f"replaying against {parse_upstream(upstream, trusted).describe()} (--upstream)"
        if recorded is not None and recorded.named:
            was = parse_upstream(recorded.url, recorded.trusted).describe()
            line += f"; it was recorded against {was}"
        return line
    if recorded is None:
        return "replaying against the official endpoints (--upstream URL to choose another)"
    desc = parse_upstream(recorded.url, recorded.trusted).describe()
    if recorded.named:
        mode = " in regular mode (HTTPS proxy)" if recorded.mode == "regular" else ""
        return f"replaying against {desc}, the upstream it was recorded against{mode}"
    return (f"replaying against {desc}: this recording does not name its upstream (made before ctproxy did), "
            "so the one its requests went to is used; --upstream URL [--trust-upstream] to choose")


def server_replay_file(path: Path, workdir: Path) -> Path:
    """What `ctproxy up --server-replay` hands to mitmproxy. Recorded flows hold what went upstream; matching
    must use what the client sent, so each request body is restored from `ctp.client_request`. mitmproxy's
    match key includes the request's scheme (host and port are ignored by our options), and a live request
    has the scheme of the replaying proxy's upstream: each flow is written once more with the other scheme,
    after all the originals, so a recording made against http://127.0.0.1:… answers a proxy replaying with
    the official https upstream, and the other way round (server_replay_reuse keeps every copy)."""
    out = workdir / "server-replay.mitm"
    with path.open("rb") as src, out.open("wb") as dst:
        writer = io.FlowWriter(dst)
        copies = []
        for flow in io.FlowReader(src).stream():
            if isinstance(flow, http.HTTPFlow):
                original = flow.metadata.get("ctp.client_request")
                if isinstance(original, bytes):
                    flow.request.raw_content = original
                other = flow.copy()
                other.request.scheme = "https" if flow.request.scheme == "http" else "http"
                copies.append(other)
            writer.add(flow)
        for flow in copies:
            writer.add(flow)
    return out


def read_flows(path: Path) -> Iterator[http.HTTPFlow]:
    with path.open("rb") as fh:
        for flow in io.FlowReader(fh).stream():
            if isinstance(flow, http.HTTPFlow):
                yield flow


def _body_text(flow: http.HTTPFlow) -> list[str]:
    body = state_of(flow).body
    value = getattr(body, "value", None)
    if isinstance(value, dict):
        return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode().splitlines()
    raw = flow.request.get_content(strict=False) or b""
    try:
        return orjson.dumps(orjson.loads(raw), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode().splitlines()
    except orjson.JSONDecodeError:
        return [f"<{len(raw)} bytes, not JSON>"]


def _headers(flow: http.HTTPFlow) -> list[str]:
    # Values of credential headers are never printed.
    from proxy.routes import CREDENTIAL_HEADERS

    return sorted(f"{k}: {'<redacted>' if k.lower() in CREDENTIAL_HEADERS else v}"
                  for k, v in flow.request.headers.items())


def _restore_client_request(flow: http.HTTPFlow) -> None:
    original = flow.metadata.get("ctp.client_request")
    if isinstance(original, bytes):
        flow.request.raw_content = original
    flow.response = None
    flow.error = None


async def _call(addon: Any, hook: str, flow: http.HTTPFlow) -> None:
    fn = getattr(addon, hook, None)
    if fn is None:
        return
    result = fn(flow)
    if inspect.isawaitable(result):
        await result


async def replay_flows(path: Path, chain: list[Any]) -> list[str]:
    out: list[str] = []
    for index, flow in enumerate(read_flows(path), 1):
        _restore_client_request(flow)
        out.append(f"=== flow {index}: {flow.request.method} {flow.request.pretty_url}")
        changed_any = False
        for addon in chain:
            before_body, before_headers = _body_text(flow), _headers(flow)
            await _call(addon, "requestheaders", flow)
            await _call(addon, "request", flow)
            after_body, after_headers = _body_text(flow), _headers(flow)
            name = type(addon).__name__
            if after_headers != before_headers:
                changed_any = True
                out.append(f"--- {name}: headers")
                out.extend(difflib.unified_diff(before_headers, after_headers, "before", "after", lineterm="", n=0))
            if after_body != before_body:
                changed_any = True
                out.append(f"--- {name}: body")
                out.extend(difflib.unified_diff(before_body, after_body, "before", "after", lineterm="", n=2))
            if flow.response is not None:
                out.append(f"--- {name}: answered locally with HTTP {flow.response.status_code}")
                break
        if not changed_any:
            out.append("(no addon changed this request)")
    return out
