"""Finding the bytes of one member's value in a JSON object (proxy/items/jsonspan.py): where it answers, the
answer is exactly that value's text; it answers for the bodies clients send, traps and all."""

from __future__ import annotations

import json

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.items.jsonspan import MAX_CANDIDATES, member_span

_TRAP_TEXT = ['"input":', '{"input": [1]}', '\\"input\\": [', '"tools":[]}', "},{", "]", "\u00e9\u2028"]
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                     st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(_TRAP_TEXT), st.text(max_size=8))
_keys = st.sampled_from(["input", "tools", "type", "text", "model", "x"])
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4),
                     max_leaves=20)
_top_keys = st.lists(st.sampled_from(["model", "tools", "instructions", "include", "store", "x_unknown"]),
                     unique=True, max_size=5)


def _styles(value: dict) -> list[bytes]:
    return [orjson.dumps(value), json.dumps(value).encode(), json.dumps(value, indent=2).encode(),
            json.dumps(value, ensure_ascii=False, separators=(" ,", " :  ")).encode()]


@settings(max_examples=300, deadline=None)
@given(_top_keys, st.integers(0, 5), st.lists(_json, max_size=6), st.dictionaries(_keys, _json, max_size=3))
def test_a_span_found_is_exactly_the_members_value(others, at, items, extra):
    keys = list(others)
    keys.insert(min(at, len(keys)), "input")
    value = {k: (items if k == "input" else extra) for k in keys}
    for raw in _styles(value):
        span = member_span(raw, keys, "input")
        if span is not None:
            assert json.loads(raw[span[0]:span[1]]) == items
        elif all(raw.count(orjson.dumps(k)) <= MAX_CANDIDATES for k in keys):  # (beyond that it may give up:
            raise AssertionError(f"not found in {raw!r}")  # the key, or the one after it, nested too often)


def test_a_codex_like_body_with_input_keys_everywhere_is_found():
    tools = [{"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
             {"type": "function", "name": "f", "parameters": {"properties": {"input": {"type": "string"}}}}]
    items = [{"type": "custom_tool_call", "call_id": f"c{i}", "name": "apply_patch", "input": '"input": ]'}
             for i in range(50)]
    value = {"model": "gpt-5", "instructions": 'say "input": [', "tools": tools, "input": items, "store": False,
             "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k"}
    raw = orjson.dumps(value)
    start, end = member_span(raw, list(value), "input")
    assert raw[start:end] == orjson.dumps(items)
    last = {"model": "gpt-5", "tools": tools, "input": items}  # the last member
    raw = json.dumps(last, indent=1).encode()
    start, end = member_span(raw, list(last), "input")
    assert json.loads(raw[start:end]) == items


def test_what_cannot_be_made_certain_is_none():
    assert member_span(b'{"model":"x"}', ["model"], "input") is None  # no such member
    assert member_span(b'{"\\u0069nput":[1]}', ["input"], "input") is None  # the key escaped otherwise
    assert member_span(b'{"input":[1],"input":[2]}', ["input", "input"], "input") is None  # told it repeats
    nested = b'{"a":[' + b",".join([b'{"input":[0]}'] * (MAX_CANDIDATES + 1)) + b'],"input":[1]}'
    assert member_span(nested, ["a", "input"], "input") is None  # too many candidates: gives up, never guesses
