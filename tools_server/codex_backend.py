"""Codex's own history/notes backend routes, served from the registry: `POST /v1/alpha/{history|notes}/v2/<tool>`.

Codex builds with the history/notes extension (`codex-rs/ext/history-notes`, research/codex-protocol.md
§4.6) do not run those tools themselves: each call is POSTed to `{base_url}/alpha/history/v2/<tool>` or
`{base_url}/alpha/notes/v2/<tool>` with the model's arguments plus a trusted
`"context": {"session_id", "current_agent_name"}`, and whatever JSON comes back is what the model reads.
Codex's base URL points at the proxy, which forwards these requests here (addons/codex_backend.py) with
the tool server's bearer token in place of the agent's credentials; the same auth rules as REST apply
(security.py), so a client that holds the token may call these routes directly too.

Who is calling (the call context the `x-ctp-*` headers give a REST call):
- task: `x-ctp-task` when the request carries it (a Codex provider's `http_headers` reach these calls
  too); else the task the journal gives a Codex session with that `session_id` header, so the history
  tools read the very items the proxy journaled for this Codex session;
- agent: `x-ctp-agent` when given; else `current_agent_name` when it names a sub-agent (`/root/worker`)
  the journal has registered in that task; else the address the journal resolved for the session (`/root`
  for a session of its own, the auto address when joining a task): the history and notes tools only serve
  registered agents, and a Codex sub-agent's own requests are journaled under its own session.

Answers: 200 `{"ok": true, "output": <text>, ...details}` (a failing tool: `{"ok": false, "error",
"message"}`, the model reads why), 400/404 with the same `ok: false` shape for arguments the tool refuses
or a tool that does not exist. Codex's `x-openai-tool-output-truncation-policy` header
(`{"mode": "bytes"|"tokens", "limit": N}`) caps the output text, as the real backend does before it answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from proxy.items.addresses import ROOT, AddressError, resolve_address
from proxy.journal.identity import JoinError, resolve_identity
from proxy.session import AGENT_HEADER, TASK_HEADER, resolve_session
from tools_server.registry import Services, ToolError, ToolResult, describe_validation
from tools_server.service import ToolService

log = logging.getLogger("ctproxy.tools")

NAMESPACES = ("history", "notes")
ROUTE = "/v1/alpha/{namespace}/v2/{tool}"
TRUNCATION_HEADER = "x-openai-tool-output-truncation-policy"
BYTES_PER_TOKEN = 4  # Codex's own estimate (approx_token_count)


class CodexContext(BaseModel):
    """What Codex injects into every call's arguments; fields it may add later are ignored."""

    model_config = ConfigDict(extra="ignore")
    session_id: str = Field(min_length=1, max_length=512)
    current_agent_name: str | None = Field(default=None, max_length=512)


class TruncationPolicy(BaseModel):
    """Codex's `TruncationPolicy` as it serializes it: `{"mode": "bytes"|"tokens", "limit": N}`."""

    mode: Literal["bytes", "tokens"]
    limit: int = Field(ge=0)

    @property
    def max_bytes(self) -> int:
        return self.limit * (BYTES_PER_TOKEN if self.mode == "tokens" else 1)


class Caller(BaseModel):
    task: str | None
    agent: str | None
    session: str | None


def caller_identity(context: CodexContext | None, headers: dict[str, str],
                    registered: Callable[[str, str], bool] = lambda task, agent: True) -> Caller:
    """The task / agent / journal session a backend call runs as (see the module docstring);
    `registered(task, address)` says whether the journal knows that agent in that task."""
    task, agent = headers.get(TASK_HEADER) or None, headers.get(AGENT_HEADER) or None
    if context is None:  # a direct client without Codex's context: exactly the REST rules
        return Caller(task=task, agent=agent, session=None)
    # The headers the journal would see on this Codex session's Responses requests.
    seen = {"session_id": context.session_id, **{k: v for k, v in headers.items() if k.startswith("x-ctp-")}}
    identity = resolve_session(seen, {})
    try:
        session_key, task_id, address = resolve_identity(identity, seen, {}, task_exists=lambda _: True)
    except JoinError as exc:
        raise ToolError(exc.message, code=exc.code) from None
    if agent is None and context.current_agent_name:
        try:
            named = resolve_address(context.current_agent_name)
        except AddressError as exc:
            raise ToolError(f"context.current_agent_name: {exc}", code="invalid_agent") from None
        if named not in (ROOT, address) and registered(task_id, named):
            address = named
    return Caller(task=task_id, agent=address, session=session_key)


def truncate_middle(text: str, max_bytes: int) -> str:
    """Keep the head and the tail within `max_bytes` UTF-8 bytes, saying how much was cut."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    half = max_bytes // 2
    cut = len(data) - 2 * half
    head = data[:half].decode("utf-8", "ignore")
    tail = data[len(data) - half:].decode("utf-8", "ignore") if half else ""
    return f"{head}\n[… {cut} bytes truncated …]\n{tail}"


def _policy(value: str | None) -> TruncationPolicy | None:
    if not value:
        return None
    try:
        return TruncationPolicy.model_validate_json(value)
    except ValidationError:
        return None  # an unknown policy spelling: answer in full rather than refuse the call


def answer(result: ToolResult, policy: TruncationPolicy | None) -> dict[str, Any]:
    body = result.structured() or {}
    key = "output" if not result.is_error else "message"
    if policy is not None and isinstance(body.get(key), str):
        body[key] = truncate_middle(body[key], policy.max_bytes)
    if result.images:
        body["images"] = [{"data": i.data_base64, "mime_type": i.mime_type} for i in result.images]
    return body


def _registered(services: Services) -> Callable[[str, str], bool]:
    """Whether the agent is registered in the task: in the store's journal (`Services.state_store()`), so an agent
    that joined through another instance on a shared store is known here too."""
    def registered(task: str, address: str) -> bool:
        return services.state_store().journal().history().agent_exists(task, address)

    return registered


def _refusal(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"ok": False, "error": code, "message": message}, status=status)


def add_routes(app: web.Application, service_of: Any) -> None:
    """`service_of(app)` returns the app's ToolService (the one road every call takes)."""

    async def handle(request: web.Request) -> web.Response:
        return await call(request, service_of(request.app))

    app.router.add_post(ROUTE, handle)


async def call(request: web.Request, service: ToolService) -> web.Response:
    registry, services = service.registry, service.services
    namespace, tool_name = request.match_info["namespace"], request.match_info["tool"]
    if namespace not in NAMESPACES:
        return _refusal(404, "unknown_namespace", f"no backend namespace {namespace[:40]!r}; "
                        f"served: {', '.join(NAMESPACES)}")
    name = f"{namespace}_{tool_name}"
    tool = registry.get(name)
    if tool is None or tool.family != namespace:
        known = ", ".join(t.name.removeprefix(namespace + "_") for t in registry.enabled_tools()
                          if t.family == namespace) or f"none (the {namespace} capability is off)"
        return _refusal(404, "unknown_tool", f"unknown or disabled {namespace} tool {tool_name[:80]!r}; "
                        f"enabled: {known}")
    try:
        raw = await request.read()
        arguments = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
        return _refusal(400, "invalid_json", "the body must be a JSON object of tool arguments")
    if not isinstance(arguments, dict):
        return _refusal(400, "invalid_arguments", "the body must be a JSON object of tool arguments")
    headers = {k.lower(): v for k, v in request.headers.items()}
    context: CodexContext | None = None
    if "context" in arguments:
        try:
            context = CodexContext.model_validate(arguments.pop("context"))
        except ValidationError as exc:
            return _refusal(400, "invalid_context", f"context: {describe_validation(exc)}")
    try:
        caller = await asyncio.to_thread(caller_identity, context, headers, _registered(services))
    except ToolError as exc:
        return _refusal(400, exc.code, exc.message)
    ctx = service.context(transport="codex", task=caller.task, agent=caller.agent, session=caller.session,
                          call_id=headers.get("x-ctp-call-id"))
    try:
        result = await service.call(name, arguments, ctx)  # the one road: discovery, policy, journal
    except ToolError as exc:  # arguments the tool refuses (or a tool not loaded), before any effect
        return _refusal(404 if exc.code in ("unknown_tool", "not_loaded") else 400, exc.code, exc.message)
    return web.json_response(answer(result, _policy(headers.get(TRUNCATION_HEADER))))
