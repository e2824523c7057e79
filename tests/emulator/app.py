"""The emulator server: aiohttp routes, the reply queues, request recording and plan execution.

Routes (each under `/v1` and the Codex prefix `/backend-api/codex`):
  POST   …/responses               scripted or default answer (JSON or SSE); a request whose input
                                   ends with `compaction_trigger` is answered from its own queue
  POST   …/responses/compact       `CompactResource`
  POST   …/responses/input_tokens  `{"object":"response.input_tokens","input_tokens":N}`
  GET    …/responses               with `Upgrade: websocket`: the Responses WebSocket mode (websocket.py)
  GET    …/responses/{id}          a stored `Response` (store != false), else 404
  DELETE …/responses/{id}
  *      anything else             recorded, answered with the real 404 `Invalid URL` error
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from .cache import CacheResult, PromptCache, is_prewarm
from .compaction import compact_resource
from .recording import BodyDecodeError, ReceivedRequest, decode_body, parse_json
from .render import Plan, RenderContext, error_plan, json_plan, render
from .replies import Compaction, FunctionCall, Reasoning, Reply, Responder, Response, Text
from .script import load_script
from .validation import Follower, InputError, followers_of, input_problem, resolve_references
from .wire import (
    CONTEXT_LENGTH_MESSAGE,
    ends_with_compaction_trigger,
    estimate_input_tokens,
    last_user_text,
    request_input,
)

PREFIXES = ("/v1", "/backend-api/codex")
BAD_JSON_MESSAGE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your "
    "HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON. "
    "If you have trouble figuring out how to fix this, please contact us through our help center at "
    "help.openai.com.)"
)
MAX_BODY = 256 * 1024 * 1024  # compaction items alone may reach 20 MiB; never refuse a test payload
MAX_HEADER = 256 * 1024
SHUTDOWN_GRACE = 0.25  # close() cancels streams still paused after this, instead of aiohttp's 60 s


def echo_reply(request: ReceivedRequest, deltas: int = 3) -> Reply:
    """The default answer: a short, deterministic echo of the newest user text. As the real API would: a call of
    the function a `tool_choice` forces (`required`: the first function tool), and a reasoning summary first
    when `reasoning.summary` asks for one."""
    body = request.json if isinstance(request.json, dict) else {}
    forced = _forced_function(body)
    if forced is not None:
        return Response([FunctionCall(forced.get("name", "tool"), _arguments_for(forced))])
    said = " ".join(last_user_text(request_input(body)).split())
    text = f"You said: {said[:200]}" if said else "Hello from the Responses emulator."
    if len(text) < deltas:  # enough characters for the requested number of deltas
        text += " ." * ((deltas - len(text) + 1) // 2)
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("summary") in ("auto", "concise", "detailed"):
        return Response([Reasoning(summary=f"Answering: {said[:80]}"), Text(text, deltas=deltas)])
    return Text(text, deltas=deltas)


def _forced_function(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The function tool `tool_choice` makes the model call: `required` (the first function), or one named."""
    choice = body.get("tool_choice")
    functions = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    if choice == "required" and functions:
        return functions[0]
    if isinstance(choice, dict) and choice.get("type") == "function":
        return next((t for t in functions if t.get("name") == choice.get("name")), None)
    return None


def _arguments_for(tool: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments that satisfy the tool's required properties (a string, number, boolean, list or object each)."""
    params = tool.get("parameters") if isinstance(tool.get("parameters"), dict) else {}
    props = params.get("properties") if isinstance(params.get("properties"), dict) else {}
    samples = {"string": "emulator", "number": 1, "integer": 1, "boolean": True, "array": [], "object": {}}
    out: dict[str, Any] = {}
    for name in params.get("required") or []:
        kind = (props.get(name) or {}).get("type") if isinstance(props.get(name), dict) else None
        out[name] = samples.get(kind if isinstance(kind, str) else "string", "emulator")
    return out


def compaction_reply(request: ReceivedRequest) -> Reply:
    """The default answer to remote compaction v2: a reasoning item, then one compaction item."""
    return Response([Reasoning(summary="Summarizing the conversation so far."), Compaction()])


class Emulator:
    """A faithful OpenAI Responses upstream on loopback, scripted by tests.

    async with Emulator() as emu:
        emu.script(Text("hi"), context_length_exceeded_400())
        ... point a client at emu.url + "/v1" ...
        assert emu.requests[0].json["model"] == "gpt-5"
    """

    def __init__(
        self,
        *,
        default_deltas: int = 3,
        validate_requests: bool = False,
        check_previous_response_id: bool = True,
        token_counter: Callable[[dict[str, Any]], int] | None = None,
        max_recorded: int | None = None,
        max_stored: int = 1000,
        context_limit_bytes: int | None = None,
        check_input_items: bool = True,
        ws_refuse: int | None = None,
        ws_connection_limit: float = 3600.0,
        ws_max_message: int = 0,
        ssl_context: Any = None,
        clock: Callable[[], float] | None = None,
    ):
        self.ssl_context = ssl_context  # an ssl.SSLContext: the emulator speaks HTTPS / wss:// (url says https)
        self.default_deltas = default_deltas
        self.validate_requests = validate_requests  # answer 400 when a body violates CreateResponse
        self.check_previous_response_id = check_previous_response_id
        # The real API's input rules (validation.py): every call has its output, every output its call,
        # reasoning stays before the item it preceded, references name stored items. False skips them all
        # (for a test that must send what the API would refuse); `previous_response_id` has its own switch.
        self.check_input_items = check_input_items
        # The prompt cache (cache.py): usage.input_tokens_details.cached_tokens, prompt_cache_options, prewarm and
        # input_transformations; each turn's record keeps its answer in `extra["cache"]` (a CacheResult).
        self.prompt_cache = PromptCache(clock) if clock is not None else PromptCache()
        self.token_counter: Callable[[dict[str, Any]], int] = token_counter or estimate_input_tokens
        self.max_recorded = max_recorded
        # An upstream whose real window is smaller than any model table says: a `POST …/responses` (a turn
        # or a compaction trigger) whose decoded body exceeds this many bytes gets the real 400
        # `context_length_exceeded`, before any script is consumed. `/responses/compact` is not limited
        # (as in the upstream issue 11 measured). None: no limit.
        self.context_limit_bytes = context_limit_bytes
        self.requests: list[ReceivedRequest] = []
        # WebSocket mode (websocket.py): refuse upgrades with this status (426: no WebSocket mode), a
        # connection's lifetime, the message size limit (0: none), and what the sockets saw.
        self.ws_refuse = ws_refuse
        self.ws_connection_limit = ws_connection_limit
        self.ws_max_message = ws_max_message
        self.ws_connections = 0
        self.ws_upgrades: list[list[tuple[str, str]]] = []  # each accepted upgrade's headers
        self.ws_other_messages: list[Any] = []  # client messages that were not response.create
        self.ws_binary: list[bytes] = []  # binary client frames, as received
        self.ws_closed: list[tuple[int, int | None]] = []  # (connection, close code) as each socket ended
        # Awaited with each turn's record before its answer is sent (HTTP and WebSocket): a test holds one
        # create here (an asyncio.Event it sets later) while others go on.
        self.before_answer: Callable[[ReceivedRequest], Awaitable[None]] | None = None
        self.stored: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._max_stored = max_stored
        # What a stored response adds to a `previous_response_id` chain: (its previous id, its input with
        # references resolved, its output); and the stored output items by id (for item_reference).
        self._turns: dict[str, tuple[str | None, list[Any], list[Any]]] = {}
        self._stored_items: dict[str, dict[str, Any]] = {}
        # The item after each reasoning item the emulator emitted (stored or not: encrypted_content
        # carries it for a stateless client), bounded like the store.
        self._followers: OrderedDict[str, Follower] = OrderedDict()
        self._queues: dict[str, deque[Responder]] = {k: deque() for k in ("responses", "compaction", "compact")}
        self._defaults: dict[str, Responder | None] = {k: None for k in self._queues}
        self._arrived = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self.host = ""
        self.port = 0

    # ---- lifecycle -----------------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> Emulator:
        app = web.Application(client_max_size=MAX_BODY, middlewares=[self._official_hosts])
        for prefix in PREFIXES:
            app.router.add_post(f"{prefix}/responses", self._responses)
            app.router.add_get(f"{prefix}/responses", self._websocket)
            app.router.add_post(f"{prefix}/responses/compact", self._compact)
            app.router.add_post(f"{prefix}/responses/input_tokens", self._input_tokens)
            app.router.add_get(f"{prefix}/responses/{{response_id}}", self._retrieve)
            app.router.add_delete(f"{prefix}/responses/{{response_id}}", self._delete)
        from .images import add_routes as add_image_routes  # POST …/images/generations (tests/emulator/images.py)

        add_image_routes(app, self)
        app.router.add_route("*", "/{tail:.*}", self._other)
        # auto_decompress=False keeps raw request bytes; we decode a copy ourselves.
        self._runner = web.AppRunner(
            app,
            access_log=None,
            auto_decompress=False,
            max_line_size=MAX_HEADER,
            max_field_size=MAX_HEADER,
            handle_signals=False,
            shutdown_timeout=SHUTDOWN_GRACE,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, ssl_context=self.ssl_context)
        await site.start()
        sockets = site._server.sockets if site._server else []  # type: ignore[union-attr]
        self.host, self.port = sockets[0].getsockname()[:2]
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Emulator:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self.ssl_context is not None else 'http'}://{host}:{self.port}"

    # ---- scripting -----------------------------------------------------------------------------

    def script(self, *replies: Responder) -> Emulator:
        """Queue answers for the next `POST …/responses` turns (not compaction triggers)."""
        self._queues["responses"].extend(replies)
        return self

    def script_compaction(self, *replies: Responder) -> Emulator:
        """Queue answers for requests whose input ends with `{"type":"compaction_trigger"}`."""
        self._queues["compaction"].extend(replies)
        return self

    def script_compact(self, *replies: Responder) -> Emulator:
        """Queue answers for `POST …/responses/compact` (`Compaction`, `HttpError` or `Raw`)."""
        self._queues["compact"].extend(replies)
        return self

    def load_script(self, source: str | Path | Mapping[str, Any] | list[Any]) -> Emulator:
        """Queue the replies of a JSON script (a file or parsed data; see script.py)."""
        loaded = load_script(source)
        self.script(*loaded.responses)
        self.script_compaction(*loaded.compaction)
        self.script_compact(*loaded.compact)
        if loaded.default is not None:
            self.set_default(loaded.default)
        return self

    def set_default(self, reply: Responder | None, *, route: str = "responses") -> None:
        """The answer used when the queue is empty; None restores the built-in default."""
        self._defaults[route] = reply

    def pending(self, route: str = "responses") -> int:
        return len(self._queues[route])

    def reset(self) -> None:
        """Forget scripts, defaults, recorded requests and stored responses."""
        for queue in self._queues.values():
            queue.clear()
        self._defaults = {k: None for k in self._queues}
        self.requests.clear()
        self.stored.clear()
        self._turns.clear()
        self._stored_items.clear()
        self._followers.clear()
        self.prompt_cache.clear()

    def _next(self, route: str, rec: ReceivedRequest) -> Reply | None:
        queue = self._queues[route]
        responder = queue.popleft() if queue else self._defaults[route]
        if responder is None:
            return None
        return responder(rec) if callable(responder) else responder

    # ---- inspection ----------------------------------------------------------------------------

    @property
    def responses_requests(self) -> list[ReceivedRequest]:
        """`POST …/responses` requests (turns and compaction triggers), oldest first."""
        return [r for r in self.requests if r.route in ("responses", "compaction")]

    @property
    def last(self) -> ReceivedRequest:
        return self.requests[-1]

    async def wait_for_requests(self, count: int, timeout: float = 10.0) -> list[ReceivedRequest]:
        """Wait until at least `count` requests were recorded."""
        async with asyncio.timeout(timeout):
            while len(self.requests) < count:
                self._arrived.clear()
                await self._arrived.wait()
        return self.requests

    # ---- recording -----------------------------------------------------------------------------

    async def _record(self, request: web.Request, route: str) -> tuple[ReceivedRequest, Plan | None]:
        raw = await request.read()
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.raw_headers]
        error: Plan | None = None
        try:
            body = decode_body(raw, request.headers.get("Content-Encoding"))
        except BodyDecodeError as exc:
            body, error = raw, error_plan(400, str(exc), "invalid_request_error")
        rec = self._remember(ReceivedRequest(
            method=request.method,
            path=request.path,
            query=request.query_string,
            headers=headers,
            raw_body=raw,
            body=body,
            json=parse_json(body, request.headers.get("Content-Type")) if error is None else None,
            received_at=asyncio.get_running_loop().time(),
            route=route,
        ))
        return rec, error

    def _remember(self, rec: ReceivedRequest) -> ReceivedRequest:
        self.requests.append(rec)
        if self.max_recorded is not None and len(self.requests) > 2 * self.max_recorded:
            del self.requests[: len(self.requests) - self.max_recorded]  # amortised trimming
        self._arrived.set()
        return rec

    async def _parsed(self, request: web.Request, route: str) -> tuple[ReceivedRequest, Plan | None]:
        """Record, then check what every JSON endpoint requires: a JSON object body."""
        rec, error = await self._record(request, route)
        if error is None and not isinstance(rec.json, dict):
            error = error_plan(400, BAD_JSON_MESSAGE, "invalid_request_error")
        return rec, error

    # ---- handlers ------------------------------------------------------------------------------

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        rec, error = await self._parsed(request, "responses")
        if error is not None:
            return await self._send(request, rec, error)
        body: dict[str, Any] = rec.json
        if ends_with_compaction_trigger(body):
            rec.route = "compaction"
        error = self._check_create(body) or self._check_input(body) or self._over_limit(rec)
        if error is not None:
            return await self._send(request, rec, error)
        reply = Response([]) if is_prewarm(body) else self._next(rec.route, rec)  # prewarm: no output
        if reply is None:
            reply = compaction_reply(rec) if rec.route == "compaction" else echo_reply(rec, self.default_deltas)
        plan = render(reply, self.cached_context(rec, body))
        if plan.response is not None:
            self._remember_followers(plan.response.get("output") or [])
            self.prompt_cache.produced(rec.extra["cache"].parts, plan.response.get("output") or [])
        plan.stall_after = getattr(reply, "stall_after", None)
        plan.stall_before_headers = bool(getattr(reply, "stall_before_headers", False))
        if self.before_answer is not None:
            await self.before_answer(rec)
        return await self._send(request, rec, plan, store=True)

    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        from .websocket import serve

        return await serve(self, request)

    def _check_create(self, body: dict[str, Any], local: Mapping[str, Any] | None = None) -> Plan | None:
        if self.validate_requests:
            from ..openapi_schema import schema_errors

            problems = schema_errors("CreateResponse", body, request=True)
            if problems:
                return error_plan(400, f"Invalid request body: {problems[0]}", "invalid_request_error")
        if not body.get("model"):
            msg = "Missing required parameter: 'model'."
            return error_plan(400, msg, "invalid_request_error", "model", "missing_required_parameter")
        prev = body.get("previous_response_id")
        if (self.check_previous_response_id and prev is not None and prev not in self.stored
                and prev not in (local or {})):
            msg = f"Previous response with id '{prev}' not found."
            return error_plan(400, msg, "invalid_request_error", "previous_response_id", "previous_response_not_found")
        return None

    def _chain(self, prev: str | None, local: Mapping[str, Any] | None = None) -> tuple[list[Any], bool]:
        """The items of a `previous_response_id` chain, oldest first, and whether all of it is known (`local`:
        a WebSocket connection's latest response, which chains even when not stored)."""
        parts: list[list[Any]] = []
        while prev is not None:
            turn = self._turns.get(prev) or (local or {}).get(prev)
            if turn is None:
                return [x for part in reversed(parts) for x in part], False
            prev, inputs, outputs = turn
            parts.append(inputs + outputs)
        return [x for part in reversed(parts) for x in part], True

    def _resolved_input(self, body: dict[str, Any]) -> tuple[list[Any], InputError | None]:
        return resolve_references(request_input(body), self._stored_items, body.get("store", True) is not False)

    def _check_input(self, body: dict[str, Any], local: Mapping[str, Any] | None = None) -> Plan | None:
        if not self.check_input_items:
            return None
        items, problem = self._resolved_input(body)
        if problem is None:
            prev = body.get("previous_response_id")
            chain, known = self._chain(prev if isinstance(prev, str) else None, local)
            problem = input_problem(chain, items, self._followers, known)
        if problem is None:
            return None
        return error_plan(problem.status, problem.message, "invalid_request_error", problem.param, problem.code)

    def cached_context(self, rec: ReceivedRequest, body: dict[str, Any],
                       local: Mapping[str, Any] | None = None) -> RenderContext:
        """The render context of a turn, with what the prompt cache says about its prompt (kept on `rec`)."""
        prev = body.get("previous_response_id")
        chain, _ = self._chain(prev if isinstance(prev, str) else None, local)
        # the chain's items are input the model reads (and the API bills), as if they had been resent
        tokens = self.token_counter(body) + (estimate_input_tokens({"input": chain}) if chain else 0)
        result: CacheResult = self.prompt_cache.serve(body, chain, self._resolved_input(body)[0], tokens)
        rec.extra["cache"] = result
        ctx = RenderContext.for_request(body, tokens)
        ctx.cached_tokens, ctx.cache_write_tokens = result.cached_tokens, result.write_tokens
        ctx.input_transformations = result.transformations
        return ctx

    def _remember_followers(self, output: list[Any]) -> None:
        self._followers.update(followers_of(output))
        while len(self._followers) > 10 * self._max_stored:
            self._followers.popitem(last=False)

    def _over_limit(self, rec: ReceivedRequest) -> Plan | None:
        if self.context_limit_bytes is None or len(rec.body) <= self.context_limit_bytes:
            return None
        return error_plan(400, CONTEXT_LENGTH_MESSAGE, "invalid_request_error", "input", "context_length_exceeded")

    async def _compact(self, request: web.Request) -> web.StreamResponse:
        rec, error = await self._parsed(request, "compact")
        if error is not None:
            return await self._send(request, rec, error)
        body: dict[str, Any] = rec.json
        if not body.get("model"):
            msg = "Missing required parameter: 'model'."
            plan = error_plan(400, msg, "invalid_request_error", "model", "missing_required_parameter")
            return await self._send(request, rec, plan)
        reply = self._next("compact", rec)
        if reply is None or isinstance(reply, Compaction):
            resource = compact_resource(
                body,
                self.token_counter(body),
                encrypted_content=reply.encrypted_content if reply else None,
                usage=reply.usage if reply else None,
            )
            plan = json_plan(resource)
            if reply is not None:
                plan.latency = reply.latency
                plan.headers += list((reply.headers or {}).items())
            rec.response_id = resource["id"]
            rec.extra["output"] = resource["output"]  # what a caller is meant to pass as its next input
        else:
            plan = render(reply, RenderContext.for_request({**body, "stream": False}, self.token_counter(body)))
        return await self._send(request, rec, plan)

    async def _input_tokens(self, request: web.Request) -> web.StreamResponse:
        rec, error = await self._parsed(request, "input_tokens")
        if error is None:
            count = self.token_counter(rec.json)
            error = json_plan({"object": "response.input_tokens", "input_tokens": count})
        return await self._send(request, rec, error)

    async def _retrieve(self, request: web.Request) -> web.StreamResponse:
        rec, _ = await self._record(request, "retrieve")
        resp = self.stored.get(request.match_info["response_id"])
        plan = json_plan(resp) if resp is not None else _not_found(request.match_info["response_id"])
        return await self._send(request, rec, plan)

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        rec, _ = await self._record(request, "delete")
        rid = request.match_info["response_id"]
        if self.stored.pop(rid, None) is None:
            return await self._send(request, rec, _not_found(rid))
        self._turns.pop(rid, None)
        return await self._send(request, rec, json_plan({"id": rid, "object": "response", "deleted": True}))

    @web.middleware
    async def _official_hosts(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Reached as api.openai.com or chatgpt.com, each host serves its own route only (official.py)."""
        from .official import wrong_host

        if wrong_host(request.headers.get("Host"), request.path):
            return await self._other(request)
        return await handler(request)

    async def _other(self, request: web.Request) -> web.StreamResponse:
        rec, _ = await self._record(request, "other")
        msg = f"Invalid URL ({request.method} {request.path})"
        return await self._send(request, rec, error_plan(404, msg, "invalid_request_error"))

    # ---- sending -------------------------------------------------------------------------------

    def _store(self, rec: ReceivedRequest, response: dict[str, Any]) -> None:
        body = rec.json if isinstance(rec.json, dict) else {}
        if body.get("store") is False:
            return  # stateless turns are not retrievable, as upstream
        self.stored[response["id"]] = response
        prev = body.get("previous_response_id")
        output = [i for i in response.get("output") or [] if isinstance(i, dict)]
        self._turns[response["id"]] = (prev if isinstance(prev, str) else None, self._resolved_input(body)[0], output)
        for item in output:
            if isinstance(item.get("id"), str):
                self._stored_items[item["id"]] = item
        while len(self.stored) > self._max_stored:
            old_id, old = self.stored.popitem(last=False)
            self._turns.pop(old_id, None)
            for item in old.get("output") or []:
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    self._stored_items.pop(item["id"], None)

    async def _send(
        self, request: web.Request, rec: ReceivedRequest, plan: Plan, store: bool = False
    ) -> web.StreamResponse:
        """Execute a plan; `store` keeps the finished Response retrievable (create only)."""
        rec.status = plan.status
        rec.response_id = rec.response_id or plan.response_id
        if plan.latency:
            await asyncio.sleep(plan.latency)
        if plan.stall_before_headers:
            await _hold_until_closed(request, rec)
            return web.Response(status=plan.status)  # never reaches anyone
        if plan.body is not None:
            if plan.status >= 400:
                rec.extra["error_body"] = plan.body  # why it was refused, for a test's report
            if store and plan.response is not None:
                self._store(rec, plan.response)
            resp = web.Response(status=plan.status, body=plan.body)
            _set_headers(resp, plan.headers)
            rec.answered_at = asyncio.get_running_loop().time()  # built; aiohttp writes it right after
            return resp
        resp = await self._stream(request, rec, plan, store)
        rec.answered_at = asyncio.get_running_loop().time()
        return resp

    async def _stream(self, request: web.Request, rec: ReceivedRequest, plan: Plan, store: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=plan.status)
        _set_headers(resp, plan.headers)
        chunks = plan.chunks or []
        limit = len(chunks) if plan.disconnect_after is None else min(plan.disconnect_after, len(chunks))
        if plan.stall_after is not None:
            limit = min(plan.stall_after, limit)
        try:
            await resp.prepare(request)
            loop = asyncio.get_running_loop()
            for index in range(limit):
                await resp.write(chunks[index])
                rec.events_sent += 1
                rec.write_times.append(loop.time())
                if delay := plan.delays.get(index):
                    await asyncio.sleep(delay)
        except ConnectionError:
            rec.client_disconnected = True
            return resp
        if plan.stall_after is not None:
            await _hold_until_closed(request, rec)
            return resp
        if plan.disconnect_after is not None:
            # close() flushes what was written, then FINs: the client sees a chunked body that
            # never ends properly, exactly like an upstream dying mid-stream.
            if request.transport is not None:
                request.transport.close()
            return resp
        if store and plan.response is not None and plan.response.get("status") == "completed":
            self._store(rec, plan.response)
        return resp


async def _hold_until_closed(request: web.Request, rec: ReceivedRequest) -> None:
    """A stalled upstream: silent, connection open, until the client (the proxy) closes it."""
    while request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.02)
    rec.client_disconnected = True


def _set_headers(resp: web.StreamResponse, headers: list[tuple[str, str]]) -> None:
    for key, value in headers:
        if key.lower() == "content-type":
            resp.headers[key] = value  # replace aiohttp's default instead of adding a second one
        else:
            resp.headers.add(key, value)


def _not_found(response_id: str) -> Plan:
    msg = f"Response with id '{response_id}' not found."
    return error_plan(404, msg, "invalid_request_error", None, None)
