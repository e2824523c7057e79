"""`ctproxy replay FILE.mitm`: run the addon chain over recorded flows offline and show, per flow,
what each addon changed in the request (a readable diff of the body and the headers).

Nothing is sent anywhere. By default a throw-away state directory is used, so replaying does not
write into the real journal.
"""

from __future__ import annotations

import asyncio
import difflib
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from mitmproxy import http, io

from proxy.flowstate import state_of


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


def run_replay(path: Path, chain: list[Any]) -> list[str]:
    return asyncio.run(replay_flows(path, chain))
