"""The budget every agent reads: one writer of a session's usage, read-your-writes (issue 29 (5)).

`record` is the one place an answer's usage is recorded (the tap at an answer's end, the bridge at each
round of a bridged turn): into this process's memo at once, and into the state database through the shared
worker, coalesced per session. `committed` waits until what was recorded is committed, so that once the
proxy has answered, a tool or CLI call in another process (the tool server, `ctproxy context`) reads this
answer's usage, never the one before."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy import dbworker, usage
from proxy.items.inputs import approx_tokens_for_bytes, input_items, items_bytes

log = logging.getLogger("ctproxy.context")


def record(services: Any, db_path: Path, session_key: str, task: str | None, agent: str | None,
           model: str | None, used: dict[str, Any], response_id: str | None) -> dbworker.DBWorker:
    """Record an answer's (or a round's) usage; returns the worker that will commit it."""
    seen = usage.make_usage(session_key, task, agent, model, used, response_id)
    services.usage.put(seen)
    db = dbworker.shared(services, db_path)
    shared = _shared_usage(services)
    if shared is not None:  # PostgreSQL: the store's statement, on the database thread (coalesced as below)
        db.put_latest(("usage", session_key),
                      lambda _conn: _guarded(shared.record, session_key, task, agent, model, used, response_id,
                                             seen.updated_at))
    else:
        db.put_latest(("usage", session_key),
                      lambda conn: usage.record_usage(conn, session_key, task, agent, model, used, response_id,
                                                      seen.updated_at))
    return db


def _guarded(write: Callable[..., None], *args: Any) -> None:
    """A usage write to the shared store: a record, so a database that is down costs a warning, never the
    batch of state writes it runs in."""
    try:
        write(*args)
    except Exception as exc:
        log.warning("context: usage not recorded in the store (%s)", type(exc).__name__)


def _shared_usage(services: Any) -> Any:
    """The store's `UsageBackend` when the process serves from a store other than the embedded one (`--store`),
    else None: the embedded store's usage is these same statements on the state database, which the database
    thread runs in its batched transaction (the embedded path stays as fast as it was)."""
    store = getattr(services, "store", None)
    return store.usage if store is not None and store.kind != "embedded" else None


def record_estimate(services: Any, db_path: Path, session_key: str, task: str | None, agent: str | None,
                    model: str | None, tokens: int) -> None:
    """Before a session's first answer with usage: an estimate of its request (issue 29 (5)), which
    `get_context_remaining` reports as an estimate until a real figure comes back. Coalesced per session."""
    at = time.time()
    shared = _shared_usage(services)
    if shared is not None:
        dbworker.shared(services, db_path).put_latest(
            ("usage_estimate", session_key),
            lambda _conn: _guarded(shared.record_estimate, session_key, task, agent, model, tokens, at))
        return
    dbworker.shared(services, db_path).put_latest(
        ("usage_estimate", session_key),
        lambda conn: usage.record_estimate(conn, session_key, task, agent, model, tokens, at))


def first_estimate(services: Any, db_path: Path, session_key: str, task: str | None, agent: str | None,
                   decided: Any, out: dict[str, Any], source_bytes: int | None) -> None:
    """A session no answer with usage came back for yet: its budget is an estimate of the forwarded request
    `out` (the window decision's estimate, when one was made; else its size at 4 bytes a token: the client's
    own body size `source_bytes` when it goes up unchanged), labelled as such. Never fails the request."""
    estimate = getattr(decided, "estimate", None)
    if estimate is not None:
        tokens = estimate.tokens
    else:
        size = source_bytes if source_bytes else items_bytes(input_items(out) or [])
        tokens = approx_tokens_for_bytes(size)
    model = out.get("model") if isinstance(out.get("model"), str) else None
    try:
        record_estimate(services, db_path, session_key, task, agent, model, int(tokens))
    except Exception:  # a record: never a reason to fail the request
        log.warning("context: a first request's estimate was not recorded")


async def committed(db: dbworker.DBWorker) -> None:
    """Wait until every write recorded so far (this answer's usage among them) is committed."""
    pending = db.settled()
    if pending is not None:
        await pending


def commit_now(db: dbworker.DBWorker) -> None:
    """An answer's usage was just recorded and the answer ends once it is committed (`committed`): start that
    commit now, while the answer's last bytes are still being passed on, rather than a batch interval later."""
    db.flush_now()


def effective_window(model: str | None, windows: dict[str, int], learned: int | None) -> int | None:
    """The one window every reader uses (seed000-defects.md 4): the model table's (config `model_windows`), or
    smaller once an upstream's `context_length_exceeded` taught it (`learned`, compaction_windows). The proxy's
    decision, the hard trigger, the reminder, `get_context_remaining` and `ctproxy show` all read this."""
    table = usage.model_window(model, windows)
    if learned is not None and learned > 0 and (table is None or learned < table):
        return learned
    return table


def learned_in_process(services: Any, model: str | None) -> int | None:
    """The smallest window this process learned (or read) for `model`, any endpoint; None when none."""
    cache = getattr(services, "compaction_windows", None) or {}
    found = [v for (m, _endpoint), (v, _at) in list(cache.items()) if m == model and v is not None]
    return min(found) if found else None


TURN_KEY = "ctp_turn"  # in a journaled answer's usage: what a bridged turn of several rounds cost


def turn_cost(shown: dict[str, Any] | None, turn: Any) -> dict[str, Any] | None:
    """The usage the journal keeps for an answer: what the agent was shown (a bridged turn's last round)
    and, for a bridged turn of several rounds, every round summed under `ctp_turn` with the rounds counted."""
    if shown is None or turn is None or getattr(turn, "rounds", 0) < 2 or not getattr(turn, "turn", None):
        return shown
    return {**shown, TURN_KEY: {**turn.turn, "rounds": turn.rounds}}


@dataclass
class ContextUsage:
    """A bridged turn's usage, written by the bridge's turn (`proxy.bridge.turn`) round by round:
    `usage` is the last round's (what the window holds, and what the agent's merged answer shows), `turn`
    every round's summed (what the turn cost: the journal, `/metrics`, the `x-ctp-turn-usage` header).
    `record`, when set (by the bridge stage), is awaited with each round's usage before that round's
    budget-reading calls run, so `get_context_remaining` inside the turn reads it (read-your-writes)."""

    usage: dict[str, Any] | None = None
    turn: dict[str, Any] | None = None
    rounds: int = 0
    record: Callable[[dict[str, Any], str | None, str | None], Awaitable[None]] | None = None


def usage_memo(st: Any) -> dict[str, Any]:
    """This request's memo of the stored usage (`proxy.usage.UsageCache.get`), on the flow's state
    (`FlowState.stored_usage`): one read per request."""
    if st.stored_usage is None:
        st.stored_usage = {}
    return st.stored_usage
