"""A big body's input list read lazily (proxy/items/lazyitems.py, proxy/host/flowbody.py): the same values as the
whole parse, items built once and only when read, and the proxy's default chain forwarding and journaling a big
request exactly as it does with the items built, without building them."""

from __future__ import annotations

import random
import re

import fastsimdjson
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy import http
from mitmproxy.test import taddons, tflow, tutils

from addons import chain
from addons.chain_addon import ChainAddon
from proxy import usage as usage_store
from proxy.host import flowbody
from proxy.host.flowbody import commit_body, responses_body
from proxy.host.flowstate import state_of
from proxy.items.inputs import client_compacts, input_facts, input_items, items_bytes
from proxy.items.lazyitems import LazyItems, as_list, is_item_list, plain_payload
from proxy.windows.notes import bootstrap as boot
from proxy.windows.notes import reminder


def _lazy(items: list[object]) -> LazyItems:
    raw = orjson.dumps(items)
    return LazyItems(fastsimdjson.parse(raw), raw, 0, len(raw))


def _items(n: int, seed: int = 0) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for k in range(n):
        role = rng.choice(["user", "assistant", "developer", "system"])
        out.append({"type": "message", "role": role,
                    "content": [{"type": "input_text", "text": f"m{k} " + "z" * rng.randrange(0, 40)}]})
        if rng.random() < 0.2:
            out.append({"type": "function_call", "call_id": f"c{k}", "name": "shell", "arguments": "{}"})
    return out


# ------------------------------------------------------------------------------ the sequence itself


def test_a_lazy_list_reads_as_the_list_it_views():
    items = [*_items(150), "a string item", 7, None, [1, 2]]
    lazy = _lazy(items)
    assert len(lazy) == len(items) and bool(lazy) and not _lazy([])
    assert lazy[0] == items[0] and lazy[-1] == items[-1] and lazy[-4] == "a string item"
    assert lazy[3:9] == items[3:9] and lazy[::-7] == items[::-7] and lazy[10:] == items[10:]
    assert list(lazy) == items and lazy == items and items == lazy and lazy == _lazy(items)
    assert lazy != items[:-1] and lazy + ["x"] == [*items, "x"] and ["x"] + lazy == ["x", *items]  # noqa: RUF005 (the operators themselves)
    with pytest.raises(IndexError):
        lazy[len(items)]
    with pytest.raises(IndexError):
        lazy[-len(items) - 1]
    with pytest.raises(TypeError):
        hash(lazy)
    with pytest.raises(TypeError):  # a JSON writer never takes it for an (empty) list
        orjson.dumps({"input": lazy})


def test_an_item_is_built_once_and_the_built_list_keeps_it():
    items = _items(100, 3)
    lazy = _lazy(items)
    first, tenth = lazy[0], lazy[10]
    assert lazy[0] is first and lazy.materialized is None  # reading items builds only them
    whole = lazy.materialize()
    assert whole == items and lazy.materialize() is whole and lazy.materialized is whole
    assert whole[0] is first and whole[10] is tenth  # (the stages match items by identity: ADR 0006)
    assert lazy[0] is first and lazy[5:7] == whole[5:7] and list(lazy) == whole
    assert as_list(lazy) is whole and as_list(whole) is whole
    assert is_item_list(lazy) and is_item_list(whole) and not is_item_list("text")


def test_an_early_stop_builds_only_what_it_read():
    items = _items(500, 4)
    lazy = _lazy(items)
    for k, _item in enumerate(lazy):
        if k == 3:
            break
    assert lazy.materialized is None and repr(lazy) == f"<LazyItems {len(items)} items, 4 built>"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.fixed_dictionaries({"type": st.sampled_from(["message", "compaction", "function_call", "reasoning",
                                                    "compaction_trigger"]),
                           "role": st.sampled_from(["user", "developer", "system", "assistant"])}),
    st.fixed_dictionaries({"role": st.one_of(st.sampled_from(["system", "user"]), st.integers(-2 ** 63, 2 ** 63 - 1))}),
    st.fixed_dictionaries({"type": st.one_of(st.integers(0, 9), st.lists(st.integers(0, 9), max_size=2))}),
    st.text(max_size=3), st.integers(0, 9), st.none()), max_size=30))
def test_the_facts_read_from_the_views_are_those_of_the_built_items(items):
    lazy = _lazy(items)
    assert input_facts(lazy) == input_facts(items)
    assert lazy.materialized is None
    assert client_compacts({"input": lazy}, input_facts(lazy)) == client_compacts({"input": items})


def test_a_resent_list_reads_only_its_new_items_with_the_same_summary(monkeypatch):
    from proxy.items import lazyitems

    seen = lazyitems._SeenLists()
    monkeypatch.setattr(lazyitems, "_SEEN", seen)
    rng = random.Random(11)
    history = _items(60, 12)
    for step in range(12):
        edited = step == 6
        if edited:  # an edit in the middle: not a resend of what was read before
            history = [*history[:10], {"type": "message", "role": "system", "content": "edited"}, *history[11:]]
        elif step != 9:  # (9: the same list again)
            history = [*history, *_items(rng.randrange(1, 5), 100 + step)]
        lazy = _lazy(history)
        assert (seen.resent_by(lazy) is not None) == (step > 0 and not edited), step
        want = (frozenset(i.get("type") for i in history),
                tuple(k for k, i in enumerate(history) if i.get("role") in ("developer", "system")))
        assert lazy.type_summary() == want
        assert input_facts(lazy) == input_facts(history)
    assert len(seen._entries) == 1  # one conversation, its newest list


def test_a_list_that_only_begins_like_one_read_before_is_read_whole(monkeypatch):
    from proxy.items import lazyitems

    seen = lazyitems._SeenLists()
    monkeypatch.setattr(lazyitems, "_SEEN", seen)
    first = [{"type": "message", "role": "user", "content": "x" * 300}]
    lazy = _lazy(first)
    assert lazy.type_summary() == (frozenset({"message"}), ())
    assert seen.resent_by(lazy) is not None  # itself: the same list
    longer = _lazy([{"type": "message", "role": "user", "content": "x" * 300, "extra": 1}])  # `}` comes later
    assert seen.resent_by(longer) is None
    assert longer.type_summary() == (frozenset({"message"}), ())
    spaced = orjson.dumps(first)[:-1] + b', {"type": "reasoning"}]'  # a space after the comma: not compared
    lazy = LazyItems(fastsimdjson.parse(spaced), spaced, 0, len(spaced))
    assert seen.resent_by(lazy) is None
    assert lazy.type_summary() == (frozenset({"message", "reasoning"}), ())


def test_what_the_read_lists_keep_alive_is_bounded(monkeypatch):
    from proxy.items import lazyitems

    seen = lazyitems._SeenLists()
    monkeypatch.setattr(lazyitems, "_SEEN", seen)
    monkeypatch.setattr(seen, "MAX_BYTES", 40_000)
    for k in range(30):
        items = [{"type": "message", "role": "user", "content": f"conversation {k} " + "y" * 10_000}]
        _lazy(items).type_summary()
        assert len(seen._entries) <= seen.MAX_ENTRIES and seen._bytes <= seen.MAX_BYTES
    _lazy([{"type": {"nested": True}, "role": "user"}]).type_summary()  # a view: not kept
    assert all(not isinstance(t, fastsimdjson.Object) for e in seen._entries.values() for t in e[4])


async def test_the_read_lists_let_their_bodies_go_once_idle(monkeypatch):
    """Issue 32, point 4: a summary nobody asked for in IDLE_SECONDS is dropped with the body it keeps alive;
    one that is asked for stays."""
    import asyncio

    from proxy.items import lazyitems

    seen = lazyitems._SeenLists()
    monkeypatch.setattr(lazyitems, "_SEEN", seen)
    monkeypatch.setattr(seen, "IDLE_SECONDS", 0.3)
    idle = _items(40, 1)
    busy = [{"type": "message", "role": "user", "content": "another start " + "z" * 300}, *_items(40, 2)]
    _lazy(idle).type_summary()
    _lazy(busy).type_summary()
    assert len(seen._entries) == 2 and seen._bytes > 0
    for _ in range(8):  # the busy conversation is resent every 0.1 s
        await asyncio.sleep(0.1)
        assert seen.resent_by(_lazy(busy)) is not None
    assert len(seen._entries) == 1 and seen.resent_by(_lazy(idle)) is None
    await asyncio.sleep(0.6)
    assert not seen._entries and seen._bytes == 0


def test_the_helpers_of_the_input_take_a_lazy_list():
    items = _items(80, 5)
    lazy = _lazy(items)
    payload = {"model": "m", "input": lazy}
    assert input_items(payload) is lazy
    assert items_bytes(lazy[4:9]) == items_bytes(items[4:9])
    built = plain_payload(payload)
    assert built == {"model": "m", "input": items} and built["input"] is lazy.materialized
    assert plain_payload(built) is built


# ------------------------------------------------------------------------------ the body codec


def _flow(body: bytes) -> object:
    req = tutils.treq(method=b"POST", scheme=b"https", host="api.openai.com", port=443, path=b"/v1/responses",
                      content=body, headers=((b"content-type", b"application/json"),
                                             (b"authorization", b"Bearer sk-test")))
    flow = tflow.tflow(req=req)
    flow.response = None
    return flow


def _big(extra: dict[str, object] | None = None, n: int = 1200) -> dict[str, object]:
    return {"model": "gpt-5", "instructions": "be brief", "tools": [{"type": "function", "name": "shell"}],
            "input": _items(n, 7), "store": False, **(extra or {})}


def test_a_big_body_is_read_lazily_with_the_values_of_the_whole_parse():
    payload = _big({"temperature": 1.0e3, "metadata": {"k": "\u00fc"}})
    raw = orjson.dumps(payload).replace(b'"\xc3\xbc"', b'"\\u00fc"')  # the client's own spelling survives
    flow = _flow(raw)
    body = responses_body(flow)
    assert body is not None and isinstance(body.view["input"], LazyItems)
    assert body.view["metadata"] == {"k": "\u00fc"} and body.view["temperature"] == 1000.0
    assert bytes(body.client_input()) == orjson.dumps(payload["input"])
    # a change beside the input: the client's bytes of the list go on, the items never built
    body.replace({**body.view, "tools": [*body.view["tools"], {"type": "web_search"}]})
    assert commit_body(flow)
    assert body.view["input"].materialized is None
    sent = flow.request.content
    assert orjson.loads(sent) == {**payload, "tools": [*payload["tools"], {"type": "web_search"}]}
    assert orjson.dumps(payload["input"]) in sent
    # a stage that reads the history gets the list, built once, with the values `loads` builds
    assert body.value == fastsimdjson.loads(raw) | {"tools": body.view["tools"]}
    assert isinstance(body.value["input"], list) and body.is_client_input(body.value["input"])


@pytest.mark.parametrize("raw", [
    pytest.param(lambda p: orjson.dumps(p)[:-1] + b',"input":[]}', id="input twice"),
    pytest.param(lambda p: orjson.dumps(p)[:-1] + b',"store":true}', id="another key twice"),
    pytest.param(lambda p: orjson.dumps({**p, "input": "text " * 20000}), id="string input"),
    pytest.param(lambda p: orjson.dumps([p]), id="array root"),
    pytest.param(lambda p: orjson.dumps(p)[:-1] + b',"x":1e400}', id="a number simdjson refuses"),
])
def test_what_cannot_be_read_lazily_is_parsed_whole_as_before(raw):
    data = raw(_big())
    body = responses_body(_flow(data))
    want = fastsimdjson.loads(data)
    if not isinstance(want, dict):
        assert body is None
        return
    assert body is not None and not isinstance(body.view.get("input"), LazyItems)
    assert body.view == want  # the last of a repeated key, as `loads` reads it


def test_a_big_body_that_is_no_json_is_left_alone():
    data = orjson.dumps(_big())[:-2]
    assert responses_body(_flow(data)) is None


# ------------------------------------------------------------------------------ the default chain


async def _forward(addon: ChainAddon, payload: dict[str, object]) -> tuple[object, bytes]:
    flow = _flow(orjson.dumps(payload))
    for hook in ("requestheaders", "request"):
        if (pending := addon.request(flow) if hook == "request" else addon.requestheaders(flow)) is not None:
            await pending
    return flow, flow.request.content


_ANSWER_ITEM = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "ok", "annotations": []}]}


def _answer(usage_tokens: int) -> http.Response:
    return http.Response.make(200, orjson.dumps({
        "id": "resp_1", "object": "response", "model": "gpt-5", "status": "completed", "output": [_ANSWER_ITEM],
        "usage": {"input_tokens": usage_tokens, "output_tokens": 10, "total_tokens": usage_tokens + 10}}),
        {"content-type": "application/json"})


@pytest.mark.parametrize(("identity", "shape"), [
    ("prompt_cache_key", "plain"), ("fingerprint", "plain"),
    ("prompt_cache_key", "reminder due"),  # the usage is near the window: a reminder is due, no tool to show it
    ("prompt_cache_key", "context tools"),  # the agent declares the context tools: guidance and the reminder go in
])
async def test_the_default_chain_forwards_and_journals_a_big_request_as_with_its_items_built(
        rt, monkeypatch, identity, shape):
    """The same conversation through the default chain twice, lazily and with every body built whole (the path
    of small bodies): the same bytes go upstream and the journal holds the same branch. Lazily, no stage builds
    the items unless something goes into the history (the journal reads a resend on the client's bytes)."""
    tools = [{"type": "function", "name": "shell"}]
    if shape == "context tools":
        tools += [{"type": "function", "name": n} for n in ("new_context", "notes_write_file", "history_read_item")]

    def conversation(tag: str) -> list[dict[str, object]]:
        extra = {"prompt_cache_key": tag} if identity == "prompt_cache_key" else {"instructions": f"be {tag}"}
        first = _big({**extra, "tools": tools})
        answer = [_ANSWER_ITEM] if shape != "plain" else []  # the agent resends the answer it got
        return [first, {**first, "input": [*first["input"], *answer,
                                           {"type": "message", "role": "user", "content": "and then?"}]}]

    window = usage_store.model_window("gpt-5", rt.config.model_windows)
    assert window
    addon = ChainAddon(chain())
    sent: dict[str, list[bytes]] = {}
    marks: dict[str, list[object]] = {}
    with taddons.context(addon):
        for tag in ("lazy", "whole"):
            if tag == "whole":
                monkeypatch.setattr(flowbody, "BIG_INPUT_BYTES", 1 << 40)
            for n, payload in enumerate(conversation(tag)):
                flow, content = await _forward(addon, payload)
                body = state_of(flow).body
                lazy = body.parsed_input
                assert isinstance(lazy, LazyItems) == (tag == "lazy")
                if tag == "lazy":  # built only where guidance goes in (with the context tools declared)
                    assert (lazy.materialized is not None) == (shape == "context tools"), "built for nothing"
                # (the journal's ids in the [id: …] markers are the session's own)
                same = re.sub(rb"\[id: it_[0-9a-f]+\]", b"[id]", content.replace(b"lazy", b"whole"))
                same = re.sub(rb"task_[0-9a-f]+", b"task_", same)  # each session's own task (the window identity)
                same = re.sub(rb'"ctp-[0-9a-f]+"', b'"ctp-"', same)  # each session's derived prompt_cache_key
                sent.setdefault(tag, []).append(same)
                marks.setdefault(tag, []).append(state_of(flow).journal_mark)
                if n == 0 and shape != "plain":  # the first answer's usage: 80% of the model's window
                    flow.response = _answer(int(window * 0.8))
                    for hook in ("responseheaders", "response"):
                        if (pending := getattr(addon, hook)(flow)) is not None:
                            await pending
        if shape == "context tools":
            assert reminder.REMINDER_MARKER.encode() in sent["lazy"][1]
            assert boot.GUIDANCE_MARKER.encode() in sent["lazy"][1]
        for a, b in zip(sent["lazy"], sent["whole"], strict=True):
            at = next((k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            assert a == b, (at, a[max(0, at - 300):at + 200], b[max(0, at - 300):at + 200])
        journal = rt.services.journal
        assert journal.flush()
        for tag in ("lazy", "whole"):
            first, second = marks[tag]
            assert second.kind == "continue" and second.input_ids[:len(first.input_ids)] == first.input_ids
        lazy_ids, whole_ids = (journal.item_ids_for_session(marks[t][0].session_key) for t in ("lazy", "whole"))
        answered = 1 if shape != "plain" else 0
        assert len(lazy_ids) == len(whole_ids) == len(_big()["input"]) + 1 + answered


def test_a_scan_builds_each_item_for_its_reader_and_keeps_none():
    """A reader that walks a whole big input once (the session's claim looks for a call in an input that has
    none) keeps nothing built: the items of a 100,000-item input stood as 300,000 small objects all through the
    request, and what else was made meanwhile stayed in their arenas after (proxy/memory.py)."""
    from proxy.session import first_model_keys

    items = [{"type": "message", "role": "user", "content": f"u{k}"} for k in range(300)]
    lazy = _lazy(items)
    first = lazy[5]
    scanned = list(lazy.scan())
    assert scanned == items and scanned[5] is first  # an item read before is the one kept
    assert repr(lazy) == f"<LazyItems {len(items)} items, 1 built>"
    assert first_model_keys(lazy) == [] and repr(lazy) == f"<LazyItems {len(items)} items, 1 built>"
    whole = lazy.materialize()
    assert list(lazy.scan()) == items and next(iter(lazy.scan())) is whole[0]
    mixed = _lazy([*items, {"type": "function_call", "call_id": "c9", "name": "x", "arguments": "{}"},
                   {"type": "message", "role": "assistant", "content": "hi"}])
    assert first_model_keys(mixed) == ["c:c9", "m:hi"] and repr(mixed).endswith(", 0 built>")


def test_the_type_summary_reads_a_long_list_in_chunks_with_the_same_facts():
    from proxy.items import lazyitems

    n = 3 * lazyitems._SUMMARY_CHUNK + 17
    items: list[object] = [{"type": "message", "role": "user", "content": "u"} for _ in range(n)]
    for k in (0, lazyitems._SUMMARY_CHUNK - 1, lazyitems._SUMMARY_CHUNK, 2 * lazyitems._SUMMARY_CHUNK + 5, n - 1):
        items[k] = {"type": "message", "role": "developer" if k % 2 else "system", "content": "d"}
    items[2 * lazyitems._SUMMARY_CHUNK + 9] = {"type": "compaction", "encrypted_content": "x"}
    assert input_facts(_lazy(items)) == input_facts(items)
    assert input_facts(_lazy(items)).client_compaction
    items[n - 3] = "not an object"  # in the last chunk: the walk of the built items, as before
    assert input_facts(_lazy(items)) == input_facts(items)
