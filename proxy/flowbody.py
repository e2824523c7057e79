"""The body codec: a Responses request body is parsed at most once and serialized at most once
per flow, only when something changed. Non-JSON and unparseable bodies are left untouched."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from mitmproxy import http

from proxy.addonlookup import find_addon
from proxy.flowstate import state_of


@dataclass
class ResponsesBody:
    value: dict[str, Any]
    changed: bool = False
    notes: list[str] = field(default_factory=list)  # which addons changed it, for replay diffs

    def replace(self, new: dict[str, Any], by: str = "") -> None:
        """Adopt a transform's result; a transform that did not apply returns the same object."""
        if new is not self.value:
            self.value = new
            self.changed = True
            if by:
                self.notes.append(by)


def request_path(flow: http.HTTPFlow) -> str:
    return flow.request.path.split("?", 1)[0]


def is_responses_create(flow: http.HTTPFlow) -> bool:
    """POST …/v1/responses or …/backend-api/codex/responses (not /compact, /input_tokens, …)."""
    if flow.request.method != "POST":
        return False
    path = request_path(flow).rstrip("/")
    return path.endswith("/v1/responses") or path.endswith("/backend-api/codex/responses")


def is_compact(flow: http.HTTPFlow) -> bool:
    return flow.request.method == "POST" and request_path(flow).rstrip("/").endswith("/responses/compact")


def responses_body(flow: http.HTTPFlow) -> ResponsesBody | None:
    """The parsed JSON object of a Responses create request, parsed once per flow."""
    st = state_of(flow)
    if st.body_checked:
        return st.body
    st.body_checked = True
    if not is_responses_create(flow) or flow.request.raw_content is None:
        return None
    ctype = flow.request.headers.get("content-type", "")
    if ctype and "json" not in ctype.lower():
        return None
    try:
        value = orjson.loads(flow.request.get_content(strict=True) or b"")
    except (ValueError, orjson.JSONDecodeError):
        return None
    if not isinstance(value, dict):
        return None
    st.body = ResponsesBody(value)
    return st.body


def commit_body(flow: http.HTTPFlow) -> bool:
    """Serialize once if changed; keeps the request's Content-Encoding. Returns True if written."""
    body = state_of(flow).body
    if not isinstance(body, ResponsesBody) or not body.changed:
        return False
    flow.request.content = orjson.dumps(body.value)
    body.changed = False
    return True


def commit_if_alone(flow: http.HTTPFlow) -> None:
    """An addon loaded alone writes the body back itself; in the chain the body writer does it once."""
    if find_addon("bodywriter") is None:
        commit_body(flow)
