"""A bridged turn: the agent's request upstream, the bridged calls run on the tool server, the next rounds
sent through the upstream-turn service, and one merged answer back (streaming or not).

- Calls start as soon as the model finished writing them; parallel tools run concurrently, sequential
  ones (notes writes, apply_patch, shell input) one at a time in the order the model wrote them.
- A failing tool's error is the call's output (the model can react); nothing is retried; a tool server
  that cannot be reached makes the output say the effect is unknown.
- A round with the agent's own calls too (mixed) ends the turn: the bridged outputs go upstream with the
  agent's next request (`BridgeMemory.pending`, or the resent `mcp_call` items).
- After `max_rounds` rounds of bridged calls, further calls are not run: their output tells the model
  so, and one last round (`tool_choice: "none"`) lets it answer.
- The agent hanging up cancels the running calls (the handler is cancelled) and no further round is sent;
  a round that fails upstream ends the agent's response with that error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.bridge.merge import (
    AGENT_ACTION_TYPES,
    MergedStream,
    PendingCall,
    RoundEnd,
    is_bridged,
    merge_responses,
    sum_usage,
)
from proxy.bridge.rawsse import EventSplitter
from proxy.bridge.specs import Offer, replace_specs, select
from proxy.items.bridged import (
    CALL_TYPES,
    BridgeMemory,
    ExecutedCall,
    anchors_of,
    call_text,
    mcp_item,
    output_item,
    parse_mcp_id,
    repair_request,
    upstream_call,
)
from proxy.metrics import proxy_metrics
from proxy.toolclient import BridgeTool, CallerUpstream, CallOutcome, ToolCall, ToolClient, ToolServerUnreachable
from proxy.upstream import UpstreamBroken, UpstreamTurns, UpstreamUnavailable, continue_turn
from proxy.windows.budget import ContextUsage
from proxy.windows.remote.overflow import CODE, response_error_code

log = logging.getLogger("ctproxy.bridge")

LIMIT_MESSAGE = ("ctproxy did not run this call: this request already used its {n} rounds of ctproxy tool calls "
                 "(bridge.max_rounds). Answer with what you have now, without calling more ctproxy tools.")
ROLLOVER_TOOL = "new_context"  # a bridged call of it may roll the session over before the next round
UNREACHABLE_MESSAGE = ("ctproxy could not reach its tool server for {name}; whether the call changed anything is "
                       "unknown: check before calling it again")


@dataclass
class BridgeJob:
    """What the bridge stage knew about the agent's request when it re-routed it (in memory only)."""

    url: str  # the upstream URL the agent's request was going to
    credentials: tuple[tuple[str, str], ...] = field(repr=False)  # taken off the flow; sent only if allowed
    credentials_allowed: bool  # proxy.routes.may_receive_credentials for `url`
    offer: Offer
    caller: CallerUpstream | None = field(default=None, repr=False)  # for tools that call an upstream
    task: str | None = None
    agent: str | None = None
    session: str | None = None
    max_rounds: int = 8
    timeout: float | None = 300.0  # until the upstream's headers, per round
    # what the offer was chosen from, to choose again when a call changes what the session carries
    catalog: tuple[BridgeTool, ...] = ()
    families: tuple[str, ...] = ()
    apply_patch_form: str = "auto"
    withheld: Mapping[str, str] | None = None  # names this request may not be offered (see specs.select)
    # the last round's usage, for the context budget (the tap reads it from the flow's state)
    context_usage: ContextUsage | None = None
    # Awaited once before the first call runs: the session's task and agent are in the state database, which
    # the tool server (another process) reads to know the caller (the journal writes them off the request path).
    registered: Callable[[], Awaitable[Any]] | None = field(default=None, repr=False)
    # The context stage's mid-turn rollover (FlowState.context_rollover): called after a round whose bridged
    # `new_context` succeeded, with the items shown so far and the next round's payload; it returns that
    # payload in the session's new window (or None: no rollover).
    rollover: Callable[[Sequence[Mapping[str, Any]], dict[str, Any]], Awaitable[dict[str, Any] | None]] | None = \
        field(default=None, repr=False)
    # The stage took the body off the request to the endpoint: it travels in the launched first round only.
    body_taken: bool = False
    launched: bool = False  # its first round was launched (at most once: `BridgeService.launch`)
    # Overflow recovery for a later round that answered `context_length_exceeded` after calls ran
    # (proxy.windows.recovery.midturn_recovery): given the first round's payload and the failed one, that
    # round again with the agent's history compacted and the executed calls carried whole (None: cannot).
    overflow: Callable[[dict[str, Any], dict[str, Any]], Awaitable[dict[str, Any] | None]] | None = \
        field(default=None, repr=False)
    ran: int = 0  # calls its turns executed: a job that ran any is never served again (nothing runs twice)

    def reoffer(self, payload: Mapping[str, Any], carried: frozenset[str]) -> Offer:
        return select(self.catalog, self.families, payload, self.apply_patch_form, ours=self.offer.specs,
                      carried=carried, withheld=self.withheld)


@dataclass
class TurnStats:
    rounds: int = 0  # upstream round trips of this turn
    bridged_calls: int = 0
    usage: dict[str, Any] | None = None  # every round's usage summed: what the turn cost
    usage_rounds: int = 0  # the rounds whose usage came back


# Tools that read the context budget: inside a bridged turn they run once the round's usage is recorded
# (its terminal event), so they answer with the window as it now is, never the round before's.
BUDGET_READERS = frozenset({"get_context_remaining"})


class CallRunner:
    """Runs a round's bridged calls on the tool server: parallel ones at once, sequential ones in order."""

    def __init__(self, tools: ToolClient, job: BridgeJob):
        self.tools, self.job = tools, job
        self._sequential = asyncio.Lock()  # FIFO: sequential calls run in the order they were started
        self.tasks: dict[str, asyncio.Task[CallOutcome]] = {}
        self._registered: asyncio.Future[Any] | None = None
        self.usage_counted = asyncio.Event()  # this round's usage is recorded (set by the turn, per round)

    def start(self, call: PendingCall) -> None:
        if call.key not in self.tasks:
            self.tasks[call.key] = asyncio.ensure_future(self._run(call))

    async def _run(self, call: PendingCall) -> CallOutcome:
        if call.item.get("name") in BUDGET_READERS:
            await self.usage_counted.wait()
        tool = self.job.offer.tool(str(call.item.get("name")))
        if tool is not None and not tool.parallel:
            async with self._sequential:
                return await self._call(call)
        return await self._call(call)

    async def _call(self, call: PendingCall) -> CallOutcome:
        name = str(call.item.get("name"))
        if self.job.registered is not None:
            if self._registered is None:
                self._registered = asyncio.ensure_future(self.job.registered())
            try:
                await asyncio.shield(self._registered)
            except Exception:  # a journal that cannot flush: the call goes on and the tool says what it knows
                log.warning("bridge: the session's registration could not be flushed before a call")
        req = ToolCall(name=name, kind=call.kind, text=call_text(call.item), call_id=call.item.get("call_id"),
                       task=self.job.task, agent=self.job.agent, session=self.job.session, upstream=self.job.caller)
        try:
            return await self.tools.call(req)
        except ToolServerUnreachable:
            return CallOutcome(UNREACHABLE_MESSAGE.format(name=name), True, "tool_server_unreachable")

    async def result(self, call: PendingCall) -> CallOutcome:
        self.start(call)
        return await self.tasks[call.key]

    def cancel(self) -> None:
        for task in self.tasks.values():
            task.cancel()


def _strip_call_ids(items: Sequence[Any], store: Any) -> list[Any]:
    """A round's output as the next round's input: call items without their item id when the upstream did
    not store them (`store: false`); everything else as received (reasoning keeps id + encrypted_content)."""
    if store is not False:
        return list(items)
    return [upstream_call(i) if isinstance(i, Mapping) and i.get("type") in CALL_TYPES else i for i in items]


def remember(memory: BridgeMemory, shown: Sequence[Mapping[str, Any]], executed: Mapping[str, ExecutedCall],
             scope: str | None = None) -> None:
    """Every executed call, anchored after the shown item just before its run of calls, and before the items
    shown after it up to the first that is not a reasoning item (an agent that drops reasoning and
    `mcp_call` items, and resends only messages, still finds the message that followed the calls)."""
    prev_id: str | None = None
    run: list[str] = []
    items = [*shown, None]
    for at, item in enumerate(items):
        iid = item.get("id") if isinstance(item, Mapping) else None
        if item is not None and parse_mcp_id(iid) is not None and iid in executed:
            run.append(str(iid))
            continue
        if run:
            following = []
            for later in items[at:]:
                if not isinstance(later, Mapping) or (parse_mcp_id(later.get("id")) is not None
                                                      and later.get("id") in executed):
                    break
                following.append(later)
                if later.get("type") != "reasoning":
                    break
            for key in run:
                ex = executed[key]
                ex.after_id = prev_id
                memory.remember_call(ex)
                for later in following:
                    for anchor in anchors_of(later, scope):
                        memory.set_before(key, anchor)
        run = []
        if item is not None:
            prev_id = iid if isinstance(iid, str) else None


class BridgedTurn:
    def __init__(self, job: BridgeJob, turns: UpstreamTurns, tools: ToolClient, memory: BridgeMemory,
                 headers: Sequence[tuple[str, str]], body: bytes, payload: dict[str, Any]):
        self.job, self.turns, self.tools, self.memory = job, turns, tools, memory
        self.headers = [*headers, *job.credentials]
        # later rounds send the JSON the bridge built: uncompressed
        self.next_headers = [(k, v) for k, v in self.headers if k.lower() != "content-encoding"]
        self.body, self.payload = body, payload
        self.stats = TurnStats()
        self.executed: dict[str, ExecutedCall] = {}
        self._carried: frozenset[str] | None = None  # tool discovery: what the last call said is carried
        self._rollover_due = False  # a bridged new_context succeeded in this round
        self._behind: set[str] = set()  # executed calls before a mid-turn rollover's boundary
        self._recovered = False  # a mid-turn overflow recovery was made (at most one per turn)

    def request(self, body: bytes, first: bool = False) -> Any:
        headers = self.headers if first else self.next_headers
        return self.turns.prepare("POST", self.job.url, headers, body, self.job.credentials_allowed)

    def _next_payload(self, payload: dict[str, Any], end_response: Mapping[str, Any], outputs: list[dict[str, Any]],
                      last: bool) -> dict[str, Any]:
        out = _strip_call_ids(end_response.get("output") or [], payload.get("store"))
        nxt = continue_turn(payload, out, outputs, end_response.get("id"))
        if last:
            nxt["tool_choice"] = "none"
        if self._carried is not None and self.job.catalog:  # a find_tools load shows in the next round
            offer = self.job.reoffer(nxt, self._carried)
            if offer.names != self.job.offer.names:
                nxt = replace_specs(nxt, self.job.offer, offer)
                self.job.offer = offer
        return nxt

    async def _count_usage(self, response: Mapping[str, Any] | None, runner: CallRunner, calls: bool) -> None:
        """At each round's terminal event: this round's usage is what the context window now holds (the
        agent is shown it), and it adds to what the turn cost. When the round's bridged calls run next, it
        is recorded first (awaited), and only then may a budget-reading call run."""
        used = response.get("usage") if isinstance(response, Mapping) else None
        cu = self.job.context_usage
        if isinstance(used, dict):
            self.stats.usage = sum_usage(self.stats.usage, used)
            self.stats.usage_rounds += 1
            if cu is not None:
                cu.usage, cu.turn, cu.rounds = used, self.stats.usage, self.stats.usage_rounds
                if calls and cu.record is not None:
                    rid, model = response.get("id"), response.get("model")  # type: ignore[union-attr]
                    try:
                        await cu.record(used, model if isinstance(model, str) else None,
                                        rid if isinstance(rid, str) else None)
                    except Exception:  # a record: a budget call then reads the round before's
                        log.warning("bridge: a round's usage was not recorded")
        runner.usage_counted.set()

    def _turn_done(self) -> None:
        if self.stats.usage:
            proxy_metrics().turn_tokens(self.stats.usage)

    def _record(self, call: PendingCall, outcome: CallOutcome) -> dict[str, Any]:
        out = output_item(call.kind, str(call.item.get("call_id", "")), outcome.output,
                          [i.data_url() for i in outcome.images], call.item.get("caller"))
        if outcome.carried is not None:
            self._carried = outcome.carried
        if call.item.get("name") == ROLLOVER_TOOL and not outcome.is_error:
            self._rollover_due = True
        self.executed[call.key] = ExecutedCall(dict(call.item), out, None)
        if outcome.error != "round_limit":
            self.job.ran += 1
        self.stats.bridged_calls += 1
        return out

    async def _rolled(self, payload: dict[str, Any], shown: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The next round in the session's new window when this round's bridged new_context rolled it over."""
        hook, due, self._rollover_due = self.job.rollover, self._rollover_due, False
        if hook is None or not due:
            return payload
        try:
            moved = await hook(shown, payload)
        except Exception:  # the context stage's records failed: the turn goes on in the old window
            log.warning("bridge: a mid-turn rollover failed; the turn goes on in the old window")
            return payload
        if moved is None:
            return payload
        self._behind.update(self.executed)  # replaced by the bootstrap: never spliced back after it
        return moved

    async def _overflowed(self, status: int, ctype: str, raw: bytes, payload: dict[str, Any]) -> dict[str, Any] | None:
        """A later round's failure that is an overflow after calls ran: that round again, smaller, from the
        overflow hook (once per turn), never the turn from round 1 (its calls would run twice). None: the
        agent gets the error together with what ran."""
        hook = self.job.overflow
        if hook is None or self._recovered or not self.executed or response_error_code(status, ctype, raw) != CODE:
            return None
        self._recovered = True
        try:
            smaller = await hook(self.payload, payload)
        except Exception:  # the window records failed: the agent gets the error with what ran
            log.warning("bridge: the overflow of a later round could not be recovered", exc_info=True)
            return None
        if smaller is None:
            return None
        log.info("bridge: round %d overflowed; sent again compacted, with the %d executed call(s) carried",
                 self.stats.rounds + 1, len(self.executed))
        return repair_request(smaller, self.memory, self.job.session)

    def _finish(self, shown_id: str | None, last_id: str | None, shown: Sequence[Mapping[str, Any]],
                pending: list[dict[str, Any]]) -> None:
        remember(self.memory, shown, {k: v for k, v in self.executed.items() if k not in self._behind},
                 self.job.session)
        if shown_id and last_id:
            self.memory.remember_turn(shown_id, last_id, pending)

    # ---- streaming --------------------------------------------------------------------------------

    async def stream(self, first: Any) -> AsyncIterator[bytes]:
        """The merged lifecycle, given the first round's answer (200, event stream) already open (the caller
        owns that one; later rounds' answers are opened and closed here)."""
        runner = CallRunner(self.tools, self.job)
        merged = MergedStream(self.job.offer.names, on_call_ready=runner.start)
        payload = self.payload
        executed_rounds = 0
        stack = contextlib.AsyncExitStack()
        answer = first
        try:
            while True:
                self.stats.rounds += 1
                try:
                    async for out in _read_round(merged, answer.chunks):
                        yield out
                except UpstreamBroken:
                    yield merged.error_event("upstream_broken", "the upstream's answer broke off")
                    return
                finally:
                    await stack.aclose()  # this round's upstream answer (a later round's)
                end = merged.end or RoundEnd("eof", None, [], False)
                await self._count_usage(end.response, runner, bool(end.calls))
                if end.terminal in ("response.failed", "error"):
                    yield merged.failure(end)
                    return
                if end.terminal == "eof":
                    yield merged.error_event("upstream_broken", "the upstream's answer ended without a terminal event")
                    return
                resp = end.response or {}
                if end.terminal == "response.incomplete" and end.calls:
                    # cut short (Codex's response.interrupt, end_turn false): the agent's turn ends as the upstream
                    # ended it; no further round, and the calls still running are cancelled (finally, below)
                    yield merged.final(end)
                    self._finish(merged.response_id, resp.get("id"), merged.output(), [])
                    return
                if not end.calls:
                    if merged.round == 0:
                        yield merged.passthrough_final(end)
                    else:
                        yield merged.final(end)
                        self._finish(merged.response_id, resp.get("id"), merged.output(), [])
                    return
                over = executed_rounds >= self.job.max_rounds
                outputs: list[dict[str, Any]] = []
                for call in end.calls:
                    outcome = CallOutcome(LIMIT_MESSAGE.format(n=self.job.max_rounds), True, "round_limit") if over \
                        else await runner.result(call)
                    outputs.append(self._record(call, outcome))
                    for out in merged.call_finished(call, None if outcome.is_error else outcome.output,
                                                    outcome.output if outcome.is_error else None):
                        yield out
                if not over:
                    executed_rounds += 1
                proxy_metrics().bridged_round("round_limit" if over else "ok")
                if end.agent_action or (over and merged.round > self.job.max_rounds):
                    # a mixed round (or the last round ignored tool_choice): the agent takes it from here
                    yield merged.final(end)
                    self._finish(merged.response_id, resp.get("id"), merged.output(), outputs)
                    return
                payload = await self._rolled(self._next_payload(payload, resp, outputs, last=over), merged.output())
                merged.bridged = self.job.offer.names
                merged.next_round()
                runner.usage_counted.clear()
                try:
                    answer = await stack.enter_async_context(
                        self.turns.stream(self.request(orjson.dumps(payload)), self.job.timeout))
                except UpstreamUnavailable as exc:
                    yield merged.error_event("upstream_unavailable", f"the upstream could not be reached for round "
                                             f"{merged.round + 1} ({exc.category})")
                    self._finish(merged.response_id, resp.get("id"), merged.output(), outputs)
                    return
                if answer.status != 200:
                    try:
                        raw = b"".join([c async for c in answer.chunks])
                    except UpstreamBroken:
                        raw = b""
                    smaller = await self._overflowed(answer.status, answer.header("content-type"), raw, payload)
                    if smaller is not None:
                        payload = smaller
                        await stack.aclose()
                        try:
                            answer = await stack.enter_async_context(
                                self.turns.stream(self.request(orjson.dumps(payload)), self.job.timeout))
                        except UpstreamUnavailable as exc:
                            yield merged.error_event("upstream_unavailable", "the upstream could not be reached "
                                                     f"for round {merged.round + 1} ({exc.category})")
                            self._finish(merged.response_id, resp.get("id"), merged.output(), outputs)
                            return
                        if answer.status == 200:
                            continue
                        try:
                            raw = b"".join([c async for c in answer.chunks])
                        except UpstreamBroken:
                            raw = b""
                    yield merged.error_event(*_error_of(raw, answer.status))
                    self._finish(merged.response_id, resp.get("id"), merged.output(), outputs)
                    return
        finally:
            runner.cancel()
            await stack.aclose()
            self._turn_done()
            self.job.rollover = self.job.overflow = None  # they hold the agent's items; the job is kept a minute

    # ---- not streaming ----------------------------------------------------------------------------

    async def hold(self, first_body: bytes) -> tuple[int, bytes]:
        """The merged Response object (status, body), given the first round's 200 JSON body."""
        runner = CallRunner(self.tools, self.job)
        payload = self.payload
        rounds: list[dict[str, Any]] = []
        shown: list[dict[str, Any]] = []
        body = first_body
        executed_rounds = 0
        try:
            while True:
                self.stats.rounds += 1
                try:
                    resp = orjson.loads(body)
                except orjson.JSONDecodeError:
                    return 502, _error_json("upstream_invalid", "the upstream's answer was not JSON")
                rounds.append(resp)
                items = [i for i in resp.get("output") or [] if isinstance(i, dict)]
                names = self.job.offer.names
                calls = [PendingCall(0, dict(i), True) for i in items if is_bridged(i, names)]
                runner.usage_counted.clear()
                await self._count_usage(resp, runner, bool(calls))
                if not calls:
                    if len(rounds) == 1:
                        return 200, body
                    shown.extend(items)
                    merged = merge_responses(rounds[0].get("id"), rounds, shown)
                    self._finish(merged.get("id"), resp.get("id"), shown, [])
                    return 200, orjson.dumps(merged)
                over = executed_rounds >= self.job.max_rounds
                if not over:
                    for c in calls:
                        runner.start(c)
                outputs: list[dict[str, Any]] = []
                for item in items:
                    call = next((c for c in calls if c.item is item or c.item == item), None)
                    if call is None:
                        shown.append(item)
                        continue
                    outcome = CallOutcome(LIMIT_MESSAGE.format(n=self.job.max_rounds), True, "round_limit") if over \
                        else await runner.result(call)
                    outputs.append(self._record(call, outcome))
                    shown.append(mcp_item(call.item, "failed" if outcome.is_error else "completed",
                                          None if outcome.is_error else outcome.output,
                                          outcome.output if outcome.is_error else None))
                executed_rounds += 0 if over else 1
                proxy_metrics().bridged_round("round_limit" if over else "ok")
                action = any(i.get("type") in AGENT_ACTION_TYPES and not is_bridged(i, names) for i in items)
                if action or (over and len(rounds) > self.job.max_rounds + 1):
                    merged = merge_responses(rounds[0].get("id"), rounds, shown)
                    self._finish(merged.get("id"), resp.get("id"), shown, outputs)
                    return 200, orjson.dumps(merged)
                payload = await self._rolled(self._next_payload(payload, resp, outputs, last=over), shown)
                try:
                    held = await self.turns.hold(self.request(orjson.dumps(payload)), self.job.timeout)
                except (UpstreamUnavailable, UpstreamBroken):
                    self._finish(rounds[0].get("id"), resp.get("id"), shown, outputs)
                    return 502, _error_json("upstream_unavailable",
                                            f"the upstream could not be reached for round {len(rounds) + 1}")
                if _failed(held):
                    smaller = await self._overflowed(held.status, held.header("content-type"), held.body, payload)
                    if smaller is not None:
                        payload = smaller
                        try:
                            held = await self.turns.hold(self.request(orjson.dumps(payload)), self.job.timeout)
                        except (UpstreamUnavailable, UpstreamBroken):
                            self._finish(rounds[0].get("id"), resp.get("id"), shown, outputs)
                            return 502, _error_json("upstream_unavailable",
                                                    f"the upstream could not be reached for round {len(rounds) + 1}")
                if _failed(held):
                    self._finish(rounds[0].get("id"), resp.get("id"), shown, outputs)
                    return held.status, with_what_ran(held.body, shown)
                body = held.body
        finally:
            runner.cancel()
            self._turn_done()
            self.job.rollover = self.job.overflow = None  # they hold the agent's items; the job is kept a minute


async def _read_round(merged: MergedStream, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """One round's events through the merger, up to its terminal event (held back by the merger); what one
    upstream chunk gives is written as one chunk (one write, as the upstream did)."""
    split = EventSplitter()
    async for chunk in chunks:
        outs: list[bytes] = []
        for raw in split.feed(chunk):
            outs.extend(merged.block(raw))
            if merged.end is not None:
                break
        if outs:
            yield outs[0] if len(outs) == 1 else b"".join(outs)
        if merged.end is not None:
            return
    for ev in split.close():
        for out in merged.event(ev):
            yield out


def _error_of(raw: bytes, status: int) -> tuple[str, str, str | None]:
    try:
        err = orjson.loads(raw).get("error") or {}
    except (orjson.JSONDecodeError, AttributeError):
        err = {}
    code = str(err.get("code") or err.get("type") or f"http_{status}")
    message = str(err.get("message") or f"the upstream answered HTTP {status}")
    return code, message, err.get("param")


def _failed(held: Any) -> bool:
    """A later round's answer that ends the turn: an HTTP error, or an overflow as a failed JSON Response."""
    return held.status != 200 or response_error_code(held.status, held.header("content-type"), held.body) == CODE


def with_what_ran(raw: bytes, shown: Sequence[Mapping[str, Any]]) -> bytes:
    """A later round's error body, handed to the agent together with what already ran (seed §5.3: no retry
    after dispatch): the message names the executed calls, and `output` holds them as the agent would have
    seen them (`mcp_call` items; resent, they go upstream as the calls and their outputs)."""
    ran = [i for i in shown if i.get("type") == "mcp_call"]
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError:
        parsed = None
    if not ran or not isinstance(parsed, dict):
        return raw
    err = parsed.get("error")
    names = ", ".join(f"{i.get('name')} ({(parse_mcp_id(i.get('id')) or ('', '?'))[1]})" for i in ran)
    note = (f" [ctproxy had already run {len(ran)} call(s) of this request before this error; they were not run "
            f"again: {names}. Their results are in this error's `output`.]")
    if isinstance(err, dict):
        parsed["error"] = {**err, "message": f"{err.get('message') or ''}{note}"}
    elif isinstance(parsed.get("status"), str):  # a failed Response object: its output is what ran
        parsed["output"] = [*ran, *(parsed.get("output") or [])]
        return orjson.dumps(parsed)
    parsed["output"] = ran
    return orjson.dumps(parsed)


def _error_json(code: str, message: str) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": "ctproxy_bridge", "code": code, "param": None}})


Writer = Callable[[bytes], Awaitable[None]]
