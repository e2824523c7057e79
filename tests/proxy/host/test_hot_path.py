"""The request path's cheap forms give exactly what the plain forms give (issue 11's cost work), and a
finished flow lets its parsed body go by reference counting instead of waiting for the cyclic collector."""

from __future__ import annotations

import asyncio
import gc
import random
import typing
from collections.abc import Sequence

import pytest
from mitmproxy import http
from mitmproxy.test import taddons
from mitmproxy.utils import typecheck

from addons import chain
from addons.chain_addon import ChainAddon
from proxy.host import mitm_typecheck
from proxy.host.flowstate import state_of
from proxy.items.inputs import _input_facts_walk, client_compacts, input_facts
from proxy.windows.notes import bootstrap as boot
from proxy.windows.notes import reminder
from tests.proxy.host.test_flow_lifetime import _exchange, _flow

# ------------------------------------------------------------------------------ mitmproxy's type check


def _cyclic_garbage_of(make: typing.Callable[[], object]) -> int:
    gc.collect()
    gc.disable()
    try:
        for _ in range(5):
            make()
        return gc.collect()
    finally:
        gc.enable()


def _messages() -> None:
    http.Request.make("POST", "http://127.0.0.1/v1/responses", b"{}")
    http.Response.make(200, b"{}")
    http.Request("127.0.0.1", 80, b"POST", b"http", b"", b"/", b"HTTP/1.1", http.Headers(), None, None, 0.0, None)


def test_mitmproxys_message_check_leaves_no_cycles_once_installed(monkeypatch):
    monkeypatch.setattr(typecheck, "check_option_type", mitm_typecheck._original)
    assert _cyclic_garbage_of(_messages) > 0  # the defect: every message makes reference cycles
    mitm_typecheck.install()
    assert mitm_typecheck.installed()
    assert _cyclic_garbage_of(_messages) == 0


CASES: list[tuple[object, object]] = [
    (None, bytes | None), (b"x", bytes | None), ("x", bytes | None), (None, typing.Optional[float]),  # noqa: UP045 (typing.Union, as mitmproxy declares options)
    (1, float), (1.5, float), (True, int), ("a", str), (1, str), (("a", 1), tuple[str, int]),
    (["a", "b"], tuple[str, int]), (("a",), tuple[str, int]), (["a", "b"], typing.Sequence[str]),
    (["a", 1], typing.Sequence[str]), ("ab", typing.Sequence[str]), (None, typing.Any), (object(), typing.Any),
    (open, typing.TextIO), ("s", typing.IO[str]), ({"a": 1}, dict[str, int]), (None, str | int | None),
]


@pytest.mark.parametrize(("value", "typeinfo"), CASES)
def test_the_check_accepts_and_refuses_what_mitmproxys_own_does(value, typeinfo):
    def outcome(fn: typing.Callable[..., None]) -> str | None:
        try:
            fn("field", value, typeinfo)
        except TypeError as exc:
            return str(exc)
        return None

    assert outcome(mitm_typecheck.check_option_type) == outcome(mitm_typecheck._original)


async def test_a_finished_flow_keeps_no_parsed_body(rt):
    addon = ChainAddon(chain())
    with taddons.context(addon):
        for stream in (False, True):
            ref = await _exchange(addon, 1, stream)
            flow = ref()
            assert flow is not None  # (mitmproxy's own layers keep a flow until the collector runs)
            for _ in range(50):  # released one loop turn after the last hook
                if state_of(flow).body is None:
                    break
                await asyncio.sleep(0)
            st = state_of(flow)
            assert st.body is None and st.tap is None and st.compaction is None and st.journal_mark is None
            assert st.body_checked  # a late reader finds no body; it never parses it again


def test_without_a_running_loop_the_state_goes_at_once(rt):
    addon = ChainAddon(chain())
    with taddons.context(addon):
        flow = _flow(2, False)
        addon.requestheaders(flow)
        pending = addon.request(flow)
        if pending is not None:
            asyncio.run(pending)
        state_of(flow).journal_mark = object()
        flow.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
        pending = addon.response(flow)
        if pending is not None:
            asyncio.run(pending)
        assert state_of(flow).journal_mark is None


# ------------------------------------------------------------------------------ one pass over the input


def _random_items(rng: random.Random) -> list[object]:
    guidance = boot.developer_message(boot.guidance_text(boot.ALL_TOOLS))
    pool: list[typing.Callable[[], object]] = [
        lambda: {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        lambda: {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        lambda: {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        lambda: {"type": "function_call_output", "call_id": "c", "output": "x"},
        lambda: {"role": "developer", "content": "be brief"},
        lambda: {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "sys"}]},
        lambda: dict(guidance),
        lambda: boot.developer_message(reminder.reminder_text(10, 100, boot.ALL_TOOLS)),
        lambda: {"type": "compaction", "encrypted_content": "e"},
        lambda: {"type": "reasoning", "role": "developer", "summary": []},
        lambda: "not an item",
        lambda: {"type": ["unhashable"]},
    ]
    weights = [20, 20, 10, 10, 4, 3, 2, 2, 1, 1, 1, 1]
    n = rng.randrange(0, 30)
    items = [rng.choices(pool, weights)[0]() for _ in range(n)]
    lead = rng.randrange(0, 3)  # often a leading run of instructions
    return [*(pool[4]() for _ in range(lead)), *items]


def _plain(items: Sequence[object], tools: Sequence[str], text: str | None) -> list[object]:
    return reminder.with_reminder(boot.insert_guidance(items, tools), text)


@pytest.mark.parametrize("seed", range(300))
def test_the_one_pass_forms_match_the_item_walks(seed):
    rng = random.Random(seed)
    items = _random_items(rng)
    facts = input_facts(items)
    assert facts == _input_facts_walk(items)
    if not any(isinstance(i, dict) and isinstance(i.get("type"), list) for i in items):
        assert client_compacts({"input": items}, facts) == client_compacts({"input": items})
    tools = rng.choice([boot.ALL_TOOLS, boot.HISTORY_TOOLS, ()])
    text = rng.choice([None, reminder.reminder_text(50, 100, boot.ALL_TOOLS)])
    fast = boot.insert_guidance(items, tools, facts.instructions)
    assert fast == boot.insert_guidance(items, tools)
    resent = None if any(reminder.is_reminder(items[k]) for k in facts.instructions) else ()
    assert reminder.with_reminder(fast, text, resent) == _plain(items, tools, text)


# ------------------------------------------------------------------------------ the journal's snapshot


async def test_the_journal_keeps_the_agents_items_as_sent_while_the_forwarded_copy_is_decorated(
        emulator, proxy_factory):
    """The journal serializes a request's items later, on its writer (off the request path): it relies on
    no stage after it changing the agent's objects. Guidance, `[id: …]` markers and web search go into
    the forwarded copy; the journal must hold the agent's items byte for byte as it sent them."""
    import sqlite3

    import orjson

    from tests.emulator import FunctionCall, Text
    from tests.proxy.windows.test_context_rollover import start

    agent = await start(emulator, proxy_factory)
    emulator.script(FunctionCall("shell", {"cmd": "ls"}, call_id="c_sh"), Text("done"), Text("again"))
    own = {"role": "developer", "content": "You are careful."}
    resp = await agent.sample(own, {"role": "user", "content": "do the work"})
    resp = await agent.sample(*await agent.run_calls(resp))
    await agent.sample({"role": "user", "content": "and more"})
    forwarded = emulator.responses_requests[-1].input_items
    assert any("[id: " in orjson.dumps(i).decode() for i in forwarded)  # the copy was decorated
    sent = [i for i in agent.history if i.get("role") != "assistant" and i.get("type") != "function_call"]
    db = agent.proxy.state_dir / "ctproxy.db"
    want = {orjson.dumps(i) for i in sent}
    got: set[bytes] = set()
    for _ in range(200):  # the writer commits in the background
        with sqlite3.connect(db) as conn:
            got = {bytes(r[0]) for r in conn.execute(
                "SELECT r.raw FROM journal_raw r JOIN journal_items i ON i.seq = r.seq WHERE i.origin = 'input'")}
        if want <= got:
            break
        await asyncio.sleep(0.05)
    assert want <= got, (want - got)
    assert not any(b"[id: " in raw or boot.GUIDANCE_MARKER.encode() in raw for raw in got)


# ------------------------------------------------------------------------------ the collector's pause


class _Owner:
    """What a hold is tied to (a flow's state, in the proxy)."""


async def test_a_big_parse_holds_the_collector_until_its_flow_is_released(rt):
    import orjson

    from proxy import gcpause
    from proxy.host.flowbody import responses_body

    assert gc.isenabled()
    small = gcpause.hold_for(_Owner(), gcpause.BIG_BODY - 1)
    assert small is None and gc.isenabled()
    addon = ChainAddon(chain())
    with taddons.context(addon):
        flow = _flow(3, False)
        flow.request.content = orjson.dumps({"model": "gpt-5", "input": [
            {"role": "user", "content": "x" * 1000} for _ in range(gcpause.BIG_BODY // 1000 + 1)]})
        assert responses_body(flow) is not None
        assert not gc.isenabled() and gcpause.paused()  # off from just before the parse
        owner = _Owner()
        other = gcpause.hold_for(owner, gcpause.BIG_BODY)  # a second body in flight: nested
        assert other is not None
        flow.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
        pending = addon.response(flow)
        if pending is not None:
            await pending
        for _ in range(50):
            if state_of(flow).gc_hold is None:
                break
            await asyncio.sleep(0)
        assert state_of(flow).gc_hold is None and not gc.isenabled()  # the other one is still open
        other.close()
        other.close()  # idempotent
        assert gc.isenabled() and not gcpause.paused()


async def test_a_hold_never_closed_by_its_flow_closes_with_its_owner_and_the_watchdog_collects(monkeypatch):
    from proxy import gcpause

    monkeypatch.setattr(gcpause, "MAX_PAUSE", 0.01)
    before = gcpause.forced

    owner = _Owner()
    assert gcpause.hold_for(owner, gcpause.BIG_BODY) is not None and not gc.isenabled()
    for _ in range(2000):  # the watchdog collects while the collector is off
        if gcpause.forced > before:
            break
        await asyncio.sleep(0.005)
    assert gcpause.forced > before
    del owner  # a flow dropped without its last hook: its state is freed, the hold closes
    assert gc.isenabled()


def test_the_collector_is_left_alone_when_it_is_off_already_or_no_loop_runs():
    from proxy import gcpause

    assert gcpause.hold_for(_Owner(), gcpause.BIG_BODY) is None  # no event loop: no watchdog, no pause
    gc.disable()
    try:

        async def inside() -> object:
            return gcpause.hold_for(_Owner(), gcpause.BIG_BODY)

        assert asyncio.run(inside()) is None and not gc.isenabled()
    finally:
        gc.enable()


# ------------------------------------------------------------------------------ what a finished flow leaves


async def test_a_pending_database_write_does_not_keep_the_agents_input_alive(rt, monkeypatch):
    """Compaction's per-request record is a coalesced write that waits for its batch. What it writes is a count;
    had it closed over the input itself, each finished flow's items (thousands of objects for a 1.5 MB body)
    would live until that batch ran, and be freed on the database thread at a moment no one chose."""
    import sys

    from proxy.dbworker import DBWorker
    from proxy.host.flowbody import responses_body

    monkeypatch.setattr(DBWorker, "_schedule_flush", lambda self: None)  # the batch stays pending
    monkeypatch.setattr(DBWorker, "_take_pending", lambda self: [])  # (a read on the worker does not take it)
    addon = ChainAddon(chain())
    with taddons.context(addon):
        flow = _flow(4, False)
        body = responses_body(flow)
        assert body is not None
        items = body.value["input"]
        del body
        for hook in ("requestheaders", "request"):
            if (pending := getattr(addon, hook)(flow)) is not None:
                await pending
        assert state_of(flow).compaction is not None  # compaction decided this request (and queued its record)
        flow.response = http.Response.make(200, b"{}", {"content-type": "application/json"})
        if (pending := addon.response(flow)) is not None:
            await pending
        for _ in range(50):
            if state_of(flow).body is None:
                break
            await asyncio.sleep(0)
        assert state_of(flow).body is None
        referrers = [type(r).__name__ for r in gc.get_referrers(items) if r is not sys._getframe()]
        assert any(key[0] == "forwarded" for key in rt.services.db._pending)  # still waiting for its batch
        assert referrers == [], referrers


async def test_a_big_resend_is_journaled_on_the_clients_own_bytes_as_on_the_items(rt):
    """History hands the journal the client's bytes of a big input (no second serialization): a resend that
    appends is aligned as `continue`, the items already journaled keep their ids, and the journal holds the items
    themselves, not the bytes' text."""
    import orjson

    from proxy.host.flowbody import responses_body

    items = [{"type": "message", "role": "user" if i % 2 == 0 else "assistant",
              "content": [{"type": "input_text" if i % 2 == 0 else "output_text", "text": f"m{i} " + "y" * 300}]}
             for i in range(300)]
    addon = ChainAddon(chain())
    marks = []
    with taddons.context(addon):
        for n, sent in enumerate((items, [*items, {"role": "user", "content": "one more"}])):
            flow = _flow(10 + n, False)
            flow.request.content = orjson.dumps({"model": "gpt-5", "prompt_cache_key": "big", "input": sent})
            body = responses_body(flow)
            assert body is not None and body.input_span() is not None  # the fast form applies
            for hook in ("requestheaders", "request"):
                if (pending := getattr(addon, hook)(flow)) is not None:
                    await pending
            marks.append(state_of(flow).journal_mark)
        first, second = marks
        assert second.kind == "continue"
        assert second.input_ids[:len(items)] == first.input_ids and len(second.input_ids) == len(items) + 1
        journal = rt.services.journal
        assert journal.flush()
        key = first.session_key
        assert len(journal.item_ids_for_session(key)) == len(items) + 1
