"""The body codec: parsed at most once, serialized at most once and only when changed, any encoding."""

from __future__ import annotations

import json
import types

import fastsimdjson
import orjson
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from mitmproxy.test import taddons, tflow, tutils

import addons
from proxy.host import flowbody


class Counting:
    def __init__(self):
        self.loads = 0
        self.dumps = 0

    def install(self, monkeypatch):
        real_loads, real_dumps = fastsimdjson.loads, orjson.dumps

        def loads(data):
            self.loads += 1
            return real_loads(data)

        def dumps(obj, *a, **k):
            self.dumps += 1
            return real_dumps(obj, *a, **k)

        # Only the codec's own module sees the counting functions (other code hashes items with orjson).
        fake = types.SimpleNamespace(dumps=dumps, JSONEncodeError=orjson.JSONEncodeError)
        monkeypatch.setattr(flowbody, "orjson", fake)
        monkeypatch.setattr(flowbody, "fastsimdjson", types.SimpleNamespace(loads=loads))


def _flow(content: bytes, headers: tuple = ((b"content-type", b"application/json"),), path: bytes = b"/v1/responses"):
    req = tutils.treq(method=b"POST", path=path, content=content, headers=list(headers), host="api.openai.com",
                      port=443, scheme=b"https")
    return tflow.tflow(req=req)


async def _run_chain(flow, tmp_path, **opts):
    chain = addons.chain()
    with taddons.context(*chain, loadcore=False) as tctx:
        tctx.options.update(ctp_state_dir=str(tmp_path), **opts)
        for addon in chain:
            fn = getattr(addon, "request", None)
            if fn is not None:
                res = fn(flow)
                if hasattr(res, "__await__"):
                    await res
        for addon in chain:
            done = getattr(addon, "done", None)
            if done:
                res = done()
                if hasattr(res, "__await__"):
                    await res
    from proxy.app import runtime

    runtime.uninstall()


@pytest.mark.parametrize("web_search", [True, False])
async def test_parsed_once_serialized_once_only_if_changed(monkeypatch, tmp_path, web_search):
    counter = Counting()
    counter.install(monkeypatch)
    raw = b'{"model":"gpt-5",   "input":"hi", "x_unknown": {"k": [1, 2.50]}}'
    flow = _flow(raw)
    await _run_chain(flow, tmp_path, ctp_disable=[] if web_search else ["web_search"])
    assert counter.loads == 1
    if web_search:
        assert counter.dumps == 1
        body = orjson.loads(flow.request.content)
        assert {"type": "web_search"} in [{"type": t["type"]} for t in body["tools"]]
        assert body["x_unknown"] == {"k": [1, 2.5]}
    else:
        assert counter.dumps == 0
        assert flow.request.raw_content == raw  # byte-identical


async def test_zstd_body_is_rewritten_and_stays_zstd(tmp_path):
    raw = orjson.dumps({"model": "gpt-5", "input": "hi"})
    flow = _flow(zstandard.ZstdCompressor().compress(raw),
                 ((b"content-type", b"application/json"), (b"content-encoding", b"zstd")))
    await _run_chain(flow, tmp_path)
    assert flow.request.headers["content-encoding"] == "zstd"
    body = orjson.loads(zstandard.ZstdDecompressor().decompressobj().decompress(flow.request.raw_content))
    assert any(t.get("type") == "web_search" for t in body["tools"])


@pytest.mark.parametrize("content", [b"not json", b"[1,2,3]", b'{"unterminated": ', b""])
async def test_non_object_or_broken_bodies_pass_untouched(tmp_path, content):
    flow = _flow(content)
    await _run_chain(flow, tmp_path)
    assert flow.request.raw_content == content


async def test_other_endpoints_are_not_parsed(monkeypatch, tmp_path):
    counter = Counting()
    counter.install(monkeypatch)
    flow = _flow(b'{"model":"x","input":"y"}', path=b"/v1/embeddings")
    await _run_chain(flow, tmp_path)
    assert counter.loads == 0 and flow.request.raw_content == b'{"model":"x","input":"y"}'


async def test_nothing_reads_the_body_when_every_body_feature_is_off(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text('{"remote_compaction": {"recover_overflow": false}}')
    counter = Counting()
    counter.install(monkeypatch)
    raw = b'{"model":"gpt-5","input":"hi"}'
    flow = _flow(raw)
    await _run_chain(flow, tmp_path, ctp_disable=["web_search", "history", "context"])
    assert counter.loads == 0 and counter.dumps == 0
    assert flow.request.raw_content == raw


async def test_answers_do_not_make_the_tap_parse_the_request_when_nobody_reads_usage(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text('{"remote_compaction": {"recover_overflow": false}}')
    counter = Counting()
    counter.install(monkeypatch)
    flow = _flow(b'{"model":"gpt-5","input":"hi"}')
    flow.response = tutils.tresp(content=b'{"object":"response","id":"r","output":[],"usage":{"input_tokens":1}}',
                                 headers=[(b"content-type", b"application/json")])
    chain = addons.chain()
    with taddons.context(*chain, loadcore=False) as tctx:
        tctx.options.update(ctp_state_dir=str(tmp_path), ctp_disable=["web_search", "history", "context"])
        for addon in chain:
            for hook in ("responseheaders", "response"):
                fn = getattr(addon, hook, None)
                if fn is not None:
                    res = fn(flow)
                    if hasattr(res, "__await__"):
                        await res
        for addon in chain:
            if hasattr(addon, "done"):
                res = addon.done()
                if hasattr(res, "__await__"):
                    await res
    from proxy.app import runtime

    runtime.uninstall()
    assert counter.loads == 0


# ---- the parse: simdjson's (fastsimdjson), orjson's values ------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6),
    max_leaves=40)


def _same(a, b) -> bool:
    """Equal values of equal types all the way down (1 and 1.0 differ, -0.0 and 0.0 differ)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a.hex() == b.hex()
    return a == b


@settings(max_examples=300, deadline=None)
@given(_JSON, st.sampled_from([0, orjson.OPT_INDENT_2]))
def test_the_parse_reads_every_document_as_orjson_does(value, option):
    """The body parse went from orjson.loads to fastsimdjson.loads (speed): for every RFC 8259 document within
    64-bit integers, the same values, types, key order and float bits."""
    raw = orjson.dumps({"model": "gpt-5", "input": [value], "x": value}, option=option)
    assert _same(fastsimdjson.loads(raw), orjson.loads(raw))


@pytest.mark.parametrize("raw", [
    b'{"model":"gpt-5","input":"hi","x":"\\ud800"}',  # a lone surrogate: orjson cannot write it
    b'{"model":"gpt-5","input":"hi","x":123456789012345678901234567890}',  # beyond 64 bits
])
async def test_a_changed_body_orjson_cannot_write_goes_on_as_the_client_sent_it(tmp_path, raw):
    flow = _flow(raw)
    await _run_chain(flow, tmp_path)  # web search would add its tool: the body changes
    assert flow.request.raw_content == raw


async def test_non_standard_numbers_are_parsed_and_forwarded_untouched_when_nothing_changes(tmp_path):
    raw = b'{"model":"gpt-5","input":"hi","temperature":NaN}'
    flow = _flow(raw)
    await _run_chain(flow, tmp_path, ctp_disable=["web_search"])
    assert flow.request.raw_content == raw


def _big_input(n: int = 400) -> list[dict]:
    return [{"type": "message", "role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "x" * 200}
            for i in range(n)]


async def test_a_big_input_no_stage_replaced_goes_on_as_the_client_wrote_it(tmp_path):
    """Web search adds its tool to a big body: the body is written again, but its input as the client's own bytes
    (here with a float and an escape orjson would write otherwise), not serialized a second time."""
    items = _big_input()
    client_input = orjson.dumps(items)
    client_input = client_input.replace(b'"turn 7 ', b'"t\\u00fcrn 7 ', 1).replace(b'"turn 9 ', b'"turn 9 \\/', 1)
    client_input = client_input.replace(b'"content":"turn 11 ', b'"x_score":1.0E3,"content":"turn 11 ', 1)
    raw = b'{"model":"gpt-5","tools":[],"input":' + client_input + b',"store":false}'
    flow = _flow(raw)
    await _run_chain(flow, tmp_path)
    sent = flow.request.content
    assert client_input in sent  # byte for byte
    body = orjson.loads(sent)
    assert body["input"] == orjson.loads(client_input)
    assert any(t.get("type") == "web_search" for t in body["tools"]) and body["store"] is False
    # web search rewrote the body, so the session's derived prompt_cache_key goes with it (issue 47)
    assert list(body) == ["model", "tools", "input", "store", "include", "prompt_cache_key"]


@pytest.mark.parametrize("raw", [
    # the input twice: what was parsed is the last one; the bytes found would be the first (or both)
    b'{"model":"gpt-5","input":' + orjson.dumps(_big_input()) + b',"input":' + orjson.dumps(_big_input(3)[1:]) + b'}',
    # written with spaces: the bytes of the first item are not orjson's
    b'{"model": "gpt-5", "input": ' + json.dumps(_big_input()).encode() + b'}',
])
async def test_an_input_whose_bytes_are_not_certain_is_serialized_as_before(tmp_path, raw):
    flow = _flow(raw)
    await _run_chain(flow, tmp_path)
    body = orjson.loads(flow.request.content)
    assert body["input"] == fastsimdjson.loads(raw)["input"]
    assert flow.request.content.count(b'"input"') == 1
    assert any(t.get("type") == "web_search" for t in body["tools"])


async def test_an_input_twice_whose_lists_begin_alike_goes_on_as_the_client_wrote_both(tmp_path):
    """The one case the check of the first and last items cannot tell (a repeated `input` key, the two lists with
    the same first item; the last one checked is the last list's): the client's own members go on, both, as it
    sent them (the upstream reads them as it would have read the client's body); never parts of each."""
    first, second = orjson.dumps(_big_input()), orjson.dumps(_big_input(3))
    raw = b'{"model":"gpt-5","input":' + first + b',"input":' + second + b'}'
    flow = _flow(raw)
    await _run_chain(flow, tmp_path)
    assert b'"input":' + first + b',"input":' + second in flow.request.content
