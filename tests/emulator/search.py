"""Hosted web search in a Responses answer, as the sidecar's executor gets it.

    emu.set_default(hosted_search(sources=[...]))

answers each `POST …/responses` that offers `{type: "web_search"}` with one `web_search_call` (its
`action.sources` when `include` asks for them) and a message citing the sources with `url_citation`
annotations, as JSON or SSE per the request's `stream`. On the Codex route (`/backend-api/codex`) the SSE
terminal `response.completed` carries `output: []`, as the live ChatGPT backend does: a client must collect
`response.output_item.done`. A request without the hosted tool gets a plain message (no search), which a
sidecar must treat as a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import orjson

from .recording import ReceivedRequest
from .render import RenderContext, encode_frame, render
from .replies import Raw, Reply, Text, WebSearch
from .wire import estimate_input_tokens, last_user_text, request_input

DEFAULT_SOURCES: tuple[Mapping[str, str], ...] = (
    {"url": "https://docs.python.org/3/library/asyncio.html", "title": "asyncio — Python docs"},
    {"url": "https://www.python.org/", "title": "Python.org"},
    {"url": "https://docs.python.org/3/library/asyncio.html", "title": "asyncio (again)"},  # a duplicate
)


def offers_search(body: Mapping) -> bool:
    tools = body.get("tools")
    return isinstance(tools, list) and any(isinstance(t, dict) and t.get("type") == "web_search" for t in tools)


def hosted_search(sources: Sequence[str | Mapping[str, str]] = DEFAULT_SOURCES, answer: str | None = None,
                  empty_terminal_on_codex: bool = True) -> Callable[[ReceivedRequest], Reply]:
    def respond(rec: ReceivedRequest) -> Reply:
        body = rec.json if isinstance(rec.json, dict) else {}
        query = " ".join(last_user_text(request_input(body)).split())
        if not offers_search(body):
            return Text(f"No search tool was offered for: {query[:80]}")
        reply = WebSearch(query=query, sources=list(sources),
                          answer=answer if answer is not None else f"Here is what the web says about {query[:80]}.")
        if not (empty_terminal_on_codex and body.get("stream") is True and rec.path.startswith("/backend-api/codex")):
            return reply
        plan = render(reply, RenderContext.for_request(body, estimate_input_tokens(body)))
        frames = []
        for event in plan.events:
            if event.get("type") == "response.completed":
                event = {**event, "response": {**event["response"], "output": []}}
            frames.append(encode_frame(event))
        return Raw(status=200, headers=[("Content-Type", "text/event-stream; charset=utf-8")], body=frames)

    return respond


def decode_events(raw: bytes) -> list[dict]:
    """The JSON events of an SSE body (for tests that read what the emulator sent)."""
    out = []
    for block in raw.split(b"\n\n"):
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):
                out.append(orjson.loads(line[6:]))
    return out
