"""The `[id: …]` projection (proxy/items/ids.py); defect 8 of issue 13: the markers
history_read_item's description refers to now exist on the forwarded copy."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import Config
from proxy.items.ids import marker, project_ids, project_item, project_payload

IMG = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}


def test_messages_and_outputs_get_real_ids_beside_their_content():
    items = [
        {"role": "user", "content": "hello"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "see"}, IMG], "extra": {"k": 1}},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "result"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "r"}]},
        {"type": "reasoning", "summary": []},
        {"role": "developer", "content": "no journal id"},
    ]
    before = copy.deepcopy(items)
    ids = ["it_1", "it_2", "it_3", "it_4", "it_5", "it_6", "it_7", None]
    out = project_ids(items, ids)
    assert items == before  # the agent's copy (and the journal's) never change
    assert out[0]["content"] == [{"type": "input_text", "text": "[id: it_1]"}, {"type": "input_text", "text": "hello"}]
    assert out[1]["content"][1:] == before[1]["content"] and out[1]["extra"] == {"k": 1}  # image and unknowns kept
    assert out[2] is items[2] and out[3] is items[3] and out[6] is items[6]  # assistant, calls, reasoning: never
    assert out[4] == {"type": "function_call_output", "call_id": "c1", "output": "[id: it_5]\nresult"}
    assert out[5]["output"][0] == {"type": "input_text", "text": "[id: it_6]"} and out[5]["call_id"] == "c2"
    assert out[7] is items[7]  # no id: none made up
    assert project_ids(out, ids) == out  # idempotent
    assert project_ids(items, ids, enabled=False) is items  # the switch
    assert project_ids(items, ids[:-1]) is items  # a mapping that does not fit: no ids rather than wrong ones
    # a stale marker (an earlier pass) is replaced, never doubled
    assert project_item(out[0], "it_9")["content"][:2] == [{"type": "input_text", "text": "[id: it_9]"},
                                                          {"type": "input_text", "text": "hello"}]
    assert project_item(out[4], "it_9")["output"] == "[id: it_9]\nresult"
    assert project_item(items[0], "bad id]\n") is items[0]  # not a journal id: nothing


def test_payload_transform_same_object_when_it_does_not_apply():
    p = {"model": "gpt-5", "input": [{"role": "assistant", "content": "x"}], "zzz": 1}
    assert project_payload(p, ["it_1"]) is p
    assert project_payload(p, ["it_1"], enabled=False) is p
    s = {"model": "gpt-5", "input": "hi", "zzz": 1}
    out = project_payload(s, ["it_1"])
    assert out["zzz"] == 1 and out["input"][0]["content"][0]["text"] == marker("it_1") and s["input"] == "hi"
    assert Config().context.id_projection is True


_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20))
_extra = st.dictionaries(st.text(min_size=1, max_size=8).filter(lambda k: k not in ("type", "role", "content",
                                                                                     "output", "call_id")),
                         _scalar, max_size=3)
_part = st.one_of(st.fixed_dictionaries({"type": st.just("input_text"), "text": st.text(max_size=30)}),
                  st.just(IMG))
_message = st.builds(lambda role, content, extra: {**extra, "type": "message", "role": role, "content": content},
                     st.sampled_from(["user", "system", "developer", "assistant"]),
                     st.one_of(st.text(max_size=30), st.lists(_part, max_size=3)), _extra)
_output = st.builds(lambda out, extra: {**extra, "type": "function_call_output", "call_id": "c", "output": out},
                    st.one_of(st.text(max_size=30), st.lists(_part, max_size=2)), _extra)
_other = st.builds(lambda extra: {**extra, "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                   _extra)
_items = st.lists(st.one_of(_message, _output, _other), max_size=8)


@settings(max_examples=200, deadline=None)
@given(_items, st.data())
def test_projection_is_idempotent_and_unknown_fields_survive(items, data):
    ids = data.draw(st.lists(st.one_of(st.none(), st.from_regex(r"it_[0-9a-f]{6}", fullmatch=True)),
                             min_size=len(items), max_size=len(items)))
    before = copy.deepcopy(items)
    once = project_ids(items, ids)
    assert items == before
    assert project_ids(once, ids) == once
    for orig, got, item_id in zip(items, once, ids, strict=True):
        for k, v in orig.items():
            if k not in ("content", "output"):
                assert got[k] == v  # unknown fields, roles, call ids: as they were
        if item_id is None or orig.get("role") == "assistant" or orig["type"] == "function_call":
            assert got is orig
            continue
        field = "content" if orig["type"] == "message" else "output"
        value = got[field]
        if isinstance(value, str):
            assert value == f"[id: {item_id}]\n" + orig[field]
        else:
            assert value[0] == {"type": "input_text", "text": f"[id: {item_id}]"}
            original = [{"type": "input_text", "text": orig[field]}] if isinstance(orig[field], str) else orig[field]
            assert value[1:] == original or (original and original[0].get("text", "").startswith("[id: "))
