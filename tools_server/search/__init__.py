"""The sidecar `openai_web_search` (seed 004 §4.2, §5.1): one Responses request with hosted web search,
run by the configured executor (`web_search.sidecar_model`, `…_effort`), independent of the agent's model.

The request carries the query verbatim and no session history: `tools: [{type: web_search}]` (with the same
live/cached and context-size mapping as native search), `tool_choice: "required"`, `store: false`,
`include: ["web_search_call.action.sources"]`. On the API-key route one JSON answer; on the ChatGPT
(Codex OAuth) route SSE, with the output taken from `response.output_item.done` events (the terminal
event lacks the full output) and a `response.completed` required. At least one `web_search_call`, or it
failed. The result: a concise answer, at most 20 de-duplicated clickable sources from the raw output
items (search-call sources and `url_citation` annotations), usage when given. Zero retries, no fallback
to native search, a fixed timeout.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from proxy.items.sse import SSEDecoder
from proxy.transforms.web_search import SIDECAR_TOOL, SOURCES_INCLUDE, WebSearchSettings
from proxy.upstream.transport import Answer
from tools_server import credentials
from tools_server.image.upcall import call_once, read_all, refusal
from tools_server.registry import CallContext, Services, Tool, ToolError, ToolResult, clip

TIMEOUT_SECONDS = 30.0  # fixed (peers: 30 s); not retried
MAX_SOURCES = 20  # the toolkit's output budget, not a promise of hosted search
MAX_ANSWER_BYTES = 16 * 1024 * 1024
INSTRUCTIONS = ("Search the web for the user's query and answer it concisely. Cite the sources you used.")
DESCRIPTION = ("Search the web with OpenAI's hosted web search and get a concise answer with up to 20 "
               "clickable sources. Only the query is sent (no conversation history), to a separate model; each "
               "call is billed separately. Not retried on failure.")


class WebSearchArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, max_length=8000, description="what to search for, as a full question")


@dataclass
class Collected:
    """The raw output items of one sidecar response and what its terminal event said."""

    items: list[dict[str, Any]] = field(default_factory=list)
    completed: bool = False
    status: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None


def request_body(query: str, cfg: Any, stream: bool) -> dict[str, Any]:
    settings = WebSearchSettings.from_config(cfg)
    body: dict[str, Any] = {
        "model": cfg.sidecar_model,
        "instructions": INSTRUCTIONS,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": query}]}],
        "tools": [settings.tool_spec()],
        "tool_choice": "required",
        "store": False,
        "include": [SOURCES_INCLUDE],
        "stream": stream,
    }
    if cfg.sidecar_effort != "auto":
        body["reasoning"] = {"effort": cfg.sidecar_effort}
    return body


def from_response(data: Any) -> Collected:
    """A non-streamed `Response` object."""
    out = Collected()
    if not isinstance(data, dict):
        out.error = "the answer is not a Response object"
        return out
    out.status = data.get("status") if isinstance(data.get("status"), str) else None
    out.completed = out.status == "completed"
    out.items = [i for i in data.get("output") or [] if isinstance(i, dict)]
    out.usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
    out.model = data.get("model") if isinstance(data.get("model"), str) else None
    if isinstance(err := data.get("error"), dict):
        out.error = str(err.get("message") or err.get("code") or "")
    return out


async def collect_sse(answer: Answer) -> Collected:
    """Output items from `response.output_item.done`; the terminal event's status, usage and error."""
    out = Collected()
    decoder = SSEDecoder()
    size = 0

    def take(events: list) -> None:
        for ev in events:
            try:
                payload = ev.json()
            except orjson.JSONDecodeError:
                continue
            if not isinstance(payload, dict):
                continue
            typ = payload.get("type")
            if typ == "response.output_item.done" and isinstance(item := payload.get("item"), dict):
                out.items.append(item)
            elif typ in ("response.completed", "response.failed", "response.incomplete"):
                resp = payload.get("response") if isinstance(payload.get("response"), dict) else {}
                out.status = resp.get("status") or typ.rsplit(".", 1)[1]
                out.completed = typ == "response.completed"
                out.usage = resp.get("usage") if isinstance(resp.get("usage"), dict) else None
                out.model = resp.get("model") if isinstance(resp.get("model"), str) else None
                if isinstance(err := resp.get("error"), dict):
                    out.error = str(err.get("message") or err.get("code") or "")
            elif typ == "error":
                out.status = "error"
                out.error = str(payload.get("message") or payload.get("code") or "error event")

    async for chunk in answer.chunks:
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise ToolError(f"{SIDECAR_TOOL}: the answer is larger than 16 MiB; it was dropped",
                            code="upstream_too_large")
        take(decoder.feed(chunk))
    take(decoder.close())
    return out


def sources_of(items: list[dict[str, Any]], limit: int = MAX_SOURCES) -> list[dict[str, str]]:
    """Clickable sources in the order the output gives them, each URL once (titles from citations)."""
    seen: dict[str, dict[str, str]] = {}
    for item in items:
        if item.get("type") == "web_search_call":
            action = item.get("action") if isinstance(item.get("action"), dict) else {}
            for src in action.get("sources") or []:
                if isinstance(src, dict) and isinstance(url := src.get("url"), str):
                    _add(seen, url, src.get("title"))
        elif item.get("type") == "message":
            for part in item.get("content") or []:
                if not isinstance(part, dict):
                    continue
                for ann in part.get("annotations") or []:
                    if isinstance(ann, dict) and ann.get("type") == "url_citation" and isinstance(ann.get("url"), str):
                        _add(seen, ann["url"], ann.get("title"))
    return list(seen.values())[:limit]


def _add(seen: dict[str, dict[str, str]], url: str, title: Any) -> None:
    url = url.strip()
    if not url.lower().startswith(("https://", "http://")):
        return  # only clickable web addresses
    key = url.split("#", 1)[0].rstrip("/")
    entry = seen.get(key)
    if entry is None:
        seen[key] = entry = {"url": url, "title": ""}
    if isinstance(title, str) and title.strip() and not entry["title"]:
        entry["title"] = clip(" ".join(title.split()), 200)


def answer_of(items: list[dict[str, Any]]) -> str:
    texts = []
    for item in items:
        if item.get("type") == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return "\n".join(t.strip() for t in texts if t.strip())


class SearchFamily:
    name = "search"

    def __init__(self, services: Services):
        self.services = services

    async def _search(self, args: WebSearchArgs, ctx: CallContext) -> ToolResult:
        cfg = self.services.config.web_search
        if cfg.sidecar_model is None:
            raise ToolError(f"{SIDECAR_TOOL}: no executor model is configured (ctproxy config set "
                            "web_search.sidecar_model MODEL)", code="not_configured")
        try:
            target = credentials.resolve(ctx)  # fresh for this dispatch
        except credentials.CredentialsMissing as exc:
            raise ToolError(f"{SIDECAR_TOOL}: {exc}", code="no_credentials") from None
        stream = target.route_kind == "codex"  # the ChatGPT backend answers Responses only as SSE

        async def read(answer: Answer) -> tuple[Collected | None, bytes]:
            if answer.status == 200 and stream:
                return await collect_sse(answer), b""
            body = await read_all(answer, MAX_ANSWER_BYTES)
            if answer.status != 200:
                return None, body
            try:
                return from_response(orjson.loads(body)), b""
            except orjson.JSONDecodeError:
                return Collected(error="the answer is not JSON"), b""

        outcome, (got, raw) = await call_once(
            ctx, SIDECAR_TOOL, target, "responses", request_body(args.query, cfg, stream), read, TIMEOUT_SECONDS,
            accept="text/event-stream" if stream else "application/json", what="the search request")
        if got is None:
            raise refusal(SIDECAR_TOOL, outcome.status, raw)
        if not got.completed:
            said = f": {clip(' '.join(got.error.split()), 300)}" if got.error else ""
            raise ToolError(f"{SIDECAR_TOOL}: the search did not complete (status {got.status or 'unknown'}){said}; "
                            "it was not retried", code="search_failed")
        calls = [i for i in got.items if i.get("type") == "web_search_call"]
        if not calls:
            raise ToolError(f"{SIDECAR_TOOL}: the executor answered without searching the web (no web_search_call); "
                            "it was not retried", code="search_failed")
        sources = sources_of(got.items)
        answer = answer_of(got.items) or "(the executor gave no text answer)"
        lines = [answer]
        if sources:
            lines += ["", "Sources:"]
            lines += [f"{n}. {s['title'] or s['url']} — {s['url']}" for n, s in enumerate(sources, 1)]
        details: dict[str, Any] = {"sources": sources, "searches": len(calls), "model": got.model or cfg.sidecar_model,
                                   "backend": target.route_kind, "account": target.account,
                                   "credential_source": target.source}
        if got.usage is not None:
            details["usage"] = got.usage
        return ToolResult(text="\n".join(lines), details=details)

    def tools(self) -> Iterable[Tool]:
        return [Tool(name=SIDECAR_TOOL, description=DESCRIPTION, family=self.name, capability="sidecar_search",
                     args_model=WebSearchArgs, execute=self._search, read_only=True,
                     parameters={"type": "object", "properties": {"query": {
                         "type": "string", "description": "what to search for, as a full question"}},
                         "required": ["query"], "additionalProperties": False}, strict=True)]

    async def close(self) -> None:
        await self.services.upstream_turns.close()


def create_family(services: Services) -> SearchFamily:
    return SearchFamily(services)
