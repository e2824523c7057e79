"""One compaction: choose what it covers, call the remote endpoint when allowed, and store the dual
representation. A failure (or a route/auth/instructions mismatch) yields a fallback-only checkpoint,
so the session moves on with readable context and the attempt is not repeated in a loop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from proxy import debuglog
from proxy.items.canonical import chain_at, session_root
from proxy.items.inputs import BYTES_PER_TOKEN
from proxy.upstream import UpstreamTurns
from proxy.windows.apply import conversation_hash, instruction_run
from proxy.windows.fallback import EXCERPT_LIMIT, fallback_text, marker
from proxy.windows.remote import protocol
from proxy.windows.remote.bootstraps import fit_input
from proxy.windows.remote.decision import TAIL_FRACTION
from proxy.windows.remote.fingerprint import Fingerprint
from proxy.windows.remote.remote import Target, run_compaction
from proxy.windows.remote.retained import RETAINED_MESSAGE_TOKEN_BUDGET, retained_user_messages
from proxy.windows.remote.store import Checkpoint, new_checkpoint_id


@dataclass(frozen=True, kw_only=True)
class Plan:
    session_key: str  # the journal session the new window belongs to (its chain's root)
    client_items: Sequence[Any]
    previous: Checkpoint | None
    replay_opaque: bool  # the previous checkpoint's opaque item is what the model currently sees
    boundary: int  # client items the new checkpoint covers
    payload: dict[str, Any]  # the request being served (model, instructions, tools, … for the call)
    window: int | None
    fingerprint: Fingerprint | None
    target: Target | None
    remote_blocked: str | None  # why the remote call is not even tried (category), else None
    reason: str  # threshold | overflow | context_threshold | context_checkpoint (the context stage)
    retained_budget: int = RETAINED_MESSAGE_TOKEN_BUDGET
    # What the model sees before the boundary, when the caller knows it better than `previous` does (a notes
    # window: its stored bootstrap, then the agent's items after its boundary); None: from `previous`.
    seen: Sequence[Any] | None = None


def lead_of(plan: Plan) -> int:
    """How many of the agent's leading instructions the new window keeps whole (never all of what it covers)."""
    n = instruction_run(plan.client_items, plan.boundary)
    return n if n < plan.boundary else 0


def covered(plan: Plan) -> tuple[list[Any], list[Any]]:
    """(what the model sees before the boundary, its readable form) under the previous checkpoint, without the
    agent's leading instructions: the new window keeps those whole, in their roles (defect 2)."""
    lead = lead_of(plan)
    if plan.seen is not None:
        seen = list(plan.seen)[instruction_run(plan.seen) if lead else 0:]
        return seen, seen
    start = plan.previous.boundary if plan.previous is not None else 0
    new = list(plan.client_items[max(start, lead):plan.boundary])
    if plan.previous is None:
        return new, new
    rec = plan.previous.record()
    kept = len(rec.leading)  # the previous window's copy of the instructions: not compacted again either
    seen = [*rec.bootstrap(plan.replay_opaque)[kept:], *new]
    if plan.window:
        # The compaction request must fit the window itself (openai/codex#8632): the previous bootstrap
        # gives way first (retained messages, then the fallback's excerpt), as in a forwarded request.
        seen = fit_input(rec.bootstrap(plan.replay_opaque)[kept:], new,
                         int(plan.window * BYTES_PER_TOKEN * 0.9)) or seen
    return seen, [*rec.bootstrap(False)[kept:], *new]


def build_request(plan: Plan, items: list[Any]) -> dict[str, Any]:
    if plan.target is not None and plan.target.kind == "codex":
        return protocol.v2_body(plan.payload, items, plan.window)
    return protocol.v1_body(plan.payload, items, plan.window)


Caller = Callable[[Target, dict[str, Any]], Awaitable[protocol.RemoteResult]]


async def compact(plan: Plan, call: Caller) -> Checkpoint:
    """Run one compaction; never raises for upstream trouble (that becomes a fallback checkpoint)."""
    cp_id = new_checkpoint_id()
    seen, readable = covered(plan)
    retained = tuple(retained_user_messages(seen, plan.retained_budget))
    failure = plan.remote_blocked
    result: protocol.RemoteResult | None = None
    started = time.perf_counter()
    if failure is None and plan.target is not None:
        try:
            result = await call(plan.target, build_request(plan, seen))
        except protocol.CompactionFailure as exc:
            failure = exc.category
    elif failure is None:
        failure = "no_endpoint"
    if result is not None and result.retained is not None:
        retained = result.retained  # the API route: the bootstrap is exactly the returned output
    root = session_root(plan.session_key)
    boundary_hash = chain_at(plan.client_items, root, plan.boundary) or ""
    lead = lead_of(plan)
    # a JSON copy: the stored bootstrap is what every later request of the window replays
    leading = tuple(orjson.loads(orjson.dumps(list(plan.client_items[:lead])))) if lead else ()
    cp = Checkpoint(
        id=cp_id,
        session_key=plan.session_key,
        created_at=time.time(),
        strategy="remote" if result is not None else "fallback",
        reason=plan.reason if result is not None else f"{plan.reason}:{failure}",
        boundary=plan.boundary,
        boundary_hash=boundary_hash,
        marker=marker(cp_id),
        fallback_text=fallback_text(cp_id, readable, excerpt_limit(plan.window)),
        compaction_item=result.compaction_item_bytes if result is not None else None,
        retained=retained,
        fingerprint=plan.fingerprint,
        usage=result.usage if result is not None else None,
        leading=leading,
        conversation_hash=conversation_hash(plan.client_items, root, lead, plan.boundary) if lead else "",
    )
    debuglog.event(
        "remote_compaction", outcome=cp.strategy, reason=failure or plan.reason, checkpoint=cp_id,
        kind=plan.target.kind if plan.target else None, model=plan.fingerprint.model if plan.fingerprint else None,
        host=_host(plan.target), input_items=len(seen), retained=len(retained),
        output_items=result.output_items if result else None, compaction_items=1 if result else 0,
        ms=(time.perf_counter() - started) * 1000,
    )
    return cp


def excerpt_limit(window: int | None) -> int:
    """The readable excerpt's size, fixed when the window opens (it is replayed as stored, issue 47): 12,000
    characters, but at most the tail's share of a small model's window, so the bootstrap leaves room to work."""
    if not window:
        return EXCERPT_LIMIT
    return max(1_000, min(EXCERPT_LIMIT, int(window * BYTES_PER_TOKEN * TAIL_FRACTION)))


def http_caller(turns: UpstreamTurns, timeout: float) -> Caller:
    async def call(target: Target, body: dict[str, Any]) -> protocol.RemoteResult:
        return await run_compaction(turns, target, body, timeout)

    return call


def retained_budget(window: int | None) -> int:
    """Codex's 64,000 tokens, but at most a quarter of a smaller model's window, so the bootstrap itself
    never lands the next request above the threshold again."""
    if not window:
        return RETAINED_MESSAGE_TOKEN_BUDGET
    return max(1, min(RETAINED_MESSAGE_TOKEN_BUDGET, window // 4))


def _host(target: Target | None) -> str | None:
    return urlsplit(target.url).hostname if target is not None else None
