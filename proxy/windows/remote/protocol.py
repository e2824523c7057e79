"""Remote compaction requests and their results, without I/O.

Codex route (v2): the session's projected input plus one trailing `compaction_trigger`, streamed,
read until `response.completed`, items taken from `response.output_item.done`.
API-key route (v1): `POST /v1/responses/compact`, a unary JSON call.
Either way exactly one `compaction` item must come back; other items may come too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from proxy.errors import UpstreamError
from proxy.items.inputs import COMPACTION_ITEM_TYPES, approx_tokens_for_bytes, item_bytes
from proxy.items.jsonbytes import dumps_kept

TRIGGER = {"type": "compaction_trigger"}
BETA_HEADER = "x-codex-beta-features"
BETA_FEATURE = "remote_compaction_v2"
TRUNCATED_OUTPUT = "Output exceeded the available model context and was truncated"
# Fields of a create request that carry over to a v2 compaction turn (everything else is dropped:
# previous_response_id, background, max_output_tokens, …).
_V2_FIELDS = (
    "model", "instructions", "tools", "tool_choice", "parallel_tool_calls", "reasoning", "store",
    "include", "prompt_cache_key", "service_tier", "text", "client_metadata",
)
# CompactResponseMethodPublicBody (openapi): the fields /responses/compact accepts.
_V1_FIELDS = ("model", "instructions", "prompt_cache_key", "prompt_cache_options", "service_tier")


class CompactionFailure(UpstreamError):
    """A failed or malformed remote compaction; `category` is safe to log and journal."""

    def __init__(self, category: str):
        super().__init__(category)
        self.category = category


@dataclass
class RemoteResult:
    compaction_item: dict[str, Any]
    compaction_item_bytes: bytes
    output_items: int
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    # `/responses/compact` only: the output items before the compaction item, exactly as returned. The
    # caller passes the whole output as the next input (responses-api.md §6.1), so they are the bootstrap.
    retained: tuple[dict[str, Any], ...] | None = None


def trim_to_window(items: list[Any], window: int, base_bytes: int = 0) -> list[Any]:
    """Codex's `trim_function_call_history_to_fit_context_window`: while the estimate exceeds the
    window, blank trailing tool outputs newest first; stop at the first item that is not one."""
    total = base_bytes + sum(item_bytes(i) for i in items)
    if approx_tokens_for_bytes(total) <= window:
        return items
    out = list(items)
    for idx in range(len(out) - 1, -1, -1):
        if approx_tokens_for_bytes(total) <= window:
            break
        item = out[idx]
        typ = item.get("type") if isinstance(item, dict) else None
        if typ in ("function_call_output", "custom_tool_call_output"):
            new = {**item, "output": TRUNCATED_OUTPUT}
        elif typ == "tool_search_output":
            new = {**item, "tools": []}
        else:
            break
        total += item_bytes(new) - item_bytes(item)
        out[idx] = new
    return out


def beta_features(existing: str | None) -> str:
    names = [n.strip() for n in (existing or "").split(",") if n.strip()]
    if BETA_FEATURE not in names:
        names.append(BETA_FEATURE)
    return ",".join(names)


def v2_body(payload: dict[str, Any], items: list[Any], window: int | None) -> dict[str, Any]:
    body = {k: payload[k] for k in _V2_FIELDS if k in payload}
    base = len(str(body.get("instructions") or "").encode()) + sum(item_bytes(t) for t in body.get("tools") or [])
    trimmed = trim_to_window(items, window, base) if window else items
    body["input"] = [*trimmed, dict(TRIGGER)]
    body["stream"] = True
    body.setdefault("store", False)
    return body


def v1_body(payload: dict[str, Any], items: list[Any], window: int | None) -> dict[str, Any]:
    body = {k: payload[k] for k in _V1_FIELDS if k in payload}
    base = len(str(body.get("instructions") or "").encode())
    body["input"] = trim_to_window(items, window, base) if window else list(items)
    return body


def _compaction_items(items: Iterable[Any]) -> list[dict[str, Any]]:
    return [i for i in items if isinstance(i, dict) and i.get("type") in COMPACTION_ITEM_TYPES]


def _exactly_one(items: list[Any]) -> dict[str, Any]:
    found = _compaction_items(items)
    if len(found) != 1:
        raise CompactionFailure("compaction_count")
    item = found[0]
    if not isinstance(item.get("encrypted_content"), str) or not item["encrypted_content"]:
        raise CompactionFailure("malformed_item")
    return item


class V2Collector:
    """Feed the decoded SSE payloads of a v2 compaction turn; `result()` validates them."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.completed = False
        self.usage: dict[str, Any] | None = None
        self.response_id: str | None = None
        self.error_code: str | None = None

    def feed(self, payload: dict[str, Any]) -> bool:
        """Returns True once the turn is over (completed, failed or error)."""
        typ = payload.get("type")
        if typ == "response.output_item.done" and isinstance(payload.get("item"), dict):
            self.items.append(payload["item"])
        elif typ == "response.completed":
            resp = payload.get("response") if isinstance(payload.get("response"), dict) else {}
            self.completed = True
            self.usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else None
            self.response_id = resp.get("id") if isinstance(resp.get("id"), str) else None
            return True
        elif typ in ("response.failed", "response.incomplete", "error"):
            resp = payload.get("response") if isinstance(payload.get("response"), dict) else {}
            err = resp.get("error") or payload.get("error") or payload
            code = err.get("code") if isinstance(err, dict) else None
            self.error_code = code if isinstance(code, str) else typ.replace("response.", "")
            return True
        return False

    def result(self) -> RemoteResult:
        if self.error_code:
            raise CompactionFailure(f"upstream_{_category(self.error_code)}")
        if not self.completed:
            raise CompactionFailure("stream_incomplete")
        item = _exactly_one(self.items)
        return RemoteResult(item, _item_bytes(item), len(self.items), self.usage, self.response_id)


def parse_v1(status: int, body: Any) -> RemoteResult:
    if status >= 400:
        err = body.get("error") if isinstance(body, dict) else None
        code = err.get("code") if isinstance(err, dict) else None
        raise CompactionFailure(f"upstream_{_category(code)}" if code else f"http_{status}")
    if not isinstance(body, dict) or not isinstance(body.get("output"), list):
        raise CompactionFailure("malformed_response")
    output = body["output"]
    item = _exactly_one(output)
    at = next(i for i, x in enumerate(output) if x is item)
    if at != len(output) - 1 or not all(isinstance(x, dict) for x in output):
        # The contract is `retained items…, compaction item`; anything after it has no place in a bootstrap.
        raise CompactionFailure("compaction_not_last")
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else None
    rid = body.get("id") if isinstance(body.get("id"), str) else None
    return RemoteResult(item, _item_bytes(item), len(output), usage, rid, tuple(output[:at]))


def _item_bytes(item: dict[str, Any]) -> bytes:
    return dumps_kept(item)  # kept with the compaction record (proxy/items/jsonbytes.py)


def _category(code: Any) -> str:
    text = str(code or "unknown")
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)[:48]
