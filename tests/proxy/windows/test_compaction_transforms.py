"""Pure parts of compaction: the readable fallback, the retained window, the projection, the hash chain."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.items.canonical import chain_at, chain_ids
from proxy.items.inputs import client_compacts
from proxy.windows.fallback import (
    EXCERPT_LIMIT,
    excerpt,
    fallback_message,
    fallback_text,
    is_fallback_message,
    marker,
    render_transcript,
)
from proxy.windows.remote.bootstraps import CompactionRecord, ProjectionContext, apply_projection, project
from proxy.windows.remote.retained import (
    RETAINED_MESSAGE_TOKEN_BUDGET,
    is_real_user_message,
    retained_user_messages,
    truncate_middle_bytes,
)
from tests.openapi_schema import validate_if_available


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text):
    # EasyInputMessage: what clients resend for earlier assistant turns
    return {"type": "message", "role": "assistant", "content": text}


def call(name, args, cid):
    return {"type": "function_call", "name": name, "arguments": args, "call_id": cid}


def output(cid, text):
    return {"type": "function_call_output", "call_id": cid, "output": text}


HISTORY = [
    {"role": "developer", "content": "be brief"},
    user("<environment_context>cwd=/x</environment_context>"),
    user("first question"),
    assistant("first answer"),
    call("shell", '{"cmd":"ls"}', "c1"),
    output("c1", "a.txt b.txt"),
    {"type": "reasoning", "summary": [{"type": "summary_text", "text": "thinking"}], "encrypted_content": "ENC"},
    user("second question"),
]


# ---- fallback ------------------------------------------------------------------------------------


def test_excerpt_keeps_head_and_tail_within_limit():
    text = "".join(f"line {i:05d}\n" for i in range(5000))
    out = excerpt(text)
    assert len(out) <= EXCERPT_LIMIT
    assert out.startswith("line 00000")
    assert out.endswith("line 04999\n")
    assert "characters omitted" in out
    head = out.split("\n\n…[")[0]
    assert 0.3 * EXCERPT_LIMIT < len(head) < 0.4 * EXCERPT_LIMIT


@pytest.mark.parametrize("n", [0, 1, EXCERPT_LIMIT, EXCERPT_LIMIT + 1, EXCERPT_LIMIT * 3 + 7, 10**6])
def test_excerpt_bounds(n):
    out = excerpt("é" * n)
    assert len(out) <= EXCERPT_LIMIT
    if n <= EXCERPT_LIMIT:
        assert out == "é" * n


def test_transcript_is_deterministic_and_never_renders_opaque_data():
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    items = [*HISTORY, {"type": "compaction", "encrypted_content": "SECRET-BLOB"},
             user_image := {"role": "user", "content": [image]}]
    a, b = render_transcript(items), render_transcript(copy.deepcopy(items))
    assert a == b
    assert "first question" in a and "a.txt b.txt" in a and "shell" in a
    assert "ENC" not in a and "SECRET-BLOB" not in a and "AAAA" not in a
    assert "[image]" in a
    assert user_image  # rendered as a placeholder only


def test_fallback_text_has_unique_marker_and_bounded_excerpt():
    items = [user("x" * 50_000), assistant("y" * 50_000), user("the latest ask")]
    text = fallback_text("cp_abc", items)
    assert text.startswith(marker("cp_abc"))
    assert "the latest ask" in text
    body = text.split("<ctproxy-compaction-fallback>\n", 1)[1].rsplit("\n</ctproxy-compaction-fallback>", 1)[0]
    assert len(body) <= EXCERPT_LIMIT
    assert fallback_text("cp_abc", items) == text
    assert marker("cp_abc") != marker("cp_abd")
    msg = fallback_message(text)
    assert is_fallback_message(msg)
    assert not is_fallback_message(user("mentions [ctproxy-compaction:v1: but no marker"))
    validate_if_available("CreateResponse", {"model": "gpt-5", "input": [msg]})


def test_earlier_fallback_inside_a_new_transcript_is_not_nested_verbatim():
    first = fallback_message(fallback_text("cp_1", [user("old")]))
    rendered = render_transcript([first, user("new")])
    assert "cp_1" not in rendered
    assert "new" in rendered


# ---- retained window -----------------------------------------------------------------------------


def test_only_real_user_messages_are_retained_in_order():
    kept = retained_user_messages(HISTORY)
    assert kept == [user("first question"), user("second question")]
    assert not is_real_user_message(HISTORY[0])
    assert not is_real_user_message(HISTORY[1])
    assert not is_real_user_message(fallback_message(fallback_text("cp_x", [user("a")])))


def test_budget_newest_first_one_truncated_older_dropped():
    big = "w" * 40_000  # 10,000 tokens
    msgs = [user(f"{i}:{big}") for i in range(10)]
    kept = retained_user_messages(msgs, budget=25_000)
    assert [m["content"][0]["text"][:2] for m in kept] == ["7:", "8:", "9:"]
    assert kept[1:] == msgs[8:]  # the two newest whole
    truncated = kept[0]["content"][0]["text"]
    assert "tokens truncated" in truncated
    assert len(truncated.encode()) <= 5000 * 4 + 40


def test_default_budget_is_codex_64k():
    assert RETAINED_MESSAGE_TOKEN_BUDGET == 64_000


def test_truncate_middle_respects_utf8_boundaries():
    text = "ä" * 1000
    out, removed = truncate_middle_bytes(text, 101)
    assert removed > 0
    out.encode("utf-8")  # valid
    assert out.startswith("ä") and out.endswith("ä")


def test_images_kept_when_text_is_truncated():
    msg = {"role": "user", "content": [{"type": "input_text", "text": "t" * 4000},
                                       {"type": "input_image", "image_url": "https://x/y.png"},
                                       {"type": "input_text", "text": "dropped"}]}
    kept = retained_user_messages([msg], budget=100)
    parts = kept[0]["content"]
    assert parts[1] == {"type": "input_image", "image_url": "https://x/y.png"}
    assert all(p.get("text") != "dropped" for p in parts)


# ---- hash chain and client compaction -------------------------------------------------------------


def test_chain_ignores_ids_and_status_but_not_content():
    a = [user("q"), {**assistant("a"), "id": "msg_1", "status": "completed"}]
    b = [user("q"), assistant("a")]
    assert chain_ids(a, "") == chain_ids(b, "")
    assert chain_at(a, "", 2) != chain_at([user("q"), assistant("A")], "", 2)
    assert chain_at(a, "", 0) is None and chain_at(a, "", 3) is None


@pytest.mark.parametrize("item", [{"type": "compaction_trigger"}, {"type": "compaction", "encrypted_content": "x"},
                                  {"type": "compaction_summary", "encrypted_content": "x"},
                                  {"type": "context_compaction"}])
def test_client_compaction_is_detected(item):
    assert client_compacts({"input": [user("a"), item]})
    assert client_compacts({"input": [user("a")], "context_management": [{"type": "compaction"}]})
    assert not client_compacts({"input": [user("a")]})


# ---- projection ----------------------------------------------------------------------------------

ITEM = {"id": "cmp_1", "type": "compaction", "encrypted_content": "OPAQUE=="}


def record(items, boundary, item=ITEM):
    retained = tuple(retained_user_messages(items[:boundary]))
    return CompactionRecord("cp_1", boundary, chain_at(items, "", boundary), retained, item,
                            fallback_text("cp_1", items[:boundary]))


def test_remote_projection_retained_then_item_then_tail():
    rec = record(HISTORY, 7)
    later = [*HISTORY, assistant("second answer"), user("third")]
    payload = {"model": "gpt-5", "input": later, "x_unknown": 1}
    out, outcome = apply_projection(payload, ProjectionContext(rec, replay_opaque=True))
    assert outcome == "remote"
    assert out["input"] == [user("first question"), ITEM, *later[7:]]
    assert out["x_unknown"] == 1 and payload["input"] is later and len(later) == 10
    validate_if_available("CreateResponse", out)


def test_fallback_projection_when_not_replayable():
    rec = record(HISTORY, 7)
    payload = {"model": "gpt-5-mini", "input": [*HISTORY, user("third")]}
    out, outcome = apply_projection(payload, ProjectionContext(rec, replay_opaque=False))
    assert outcome == "fallback"
    assert len(out["input"]) == 1 + 2
    assert is_fallback_message(out["input"][0])
    assert "OPAQUE" not in str(out["input"])
    validate_if_available("CreateResponse", out)


def test_fallback_only_record_uses_fallback_even_if_replay_allowed():
    rec = record(HISTORY, 7, item=None)
    _, outcome = apply_projection({"input": HISTORY}, ProjectionContext(rec, True))
    assert outcome == "fallback"


def test_diverged_history_is_left_alone():
    rec = record(HISTORY, 7)
    edited = copy.deepcopy(HISTORY)
    edited[2] = user("first question, edited")
    payload = {"model": "gpt-5", "input": edited}
    out, outcome = apply_projection(payload, ProjectionContext(rec, True))
    assert (out, outcome) == (payload, "diverged")
    assert out is payload
    short = {"model": "gpt-5", "input": HISTORY[:3]}
    assert apply_projection(short, ProjectionContext(rec, True)) == (short, "diverged")


def test_projection_is_idempotent():
    rec = record(HISTORY, 7)
    ctx = ProjectionContext(rec, True)
    once = project({"model": "gpt-5", "input": [*HISTORY, user("more")]}, ctx)
    assert project(once, ctx) is once
    assert apply_projection(once, ctx)[1] == "already"
    fb = ProjectionContext(rec, False)
    once_fb = project({"model": "gpt-5", "input": HISTORY}, fb)
    assert project(once_fb, fb) is once_fb


def test_not_applicable_without_list_input():
    rec = record(HISTORY, 7)
    payload = {"model": "gpt-5"}
    assert apply_projection(payload, ProjectionContext(rec, True)) == (payload, "not_applicable")


_texts = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
_item = st.one_of(
    _texts.map(user), _texts.map(assistant),
    st.tuples(_texts, _texts).map(lambda t: call("f", t[0], "c")), _texts.map(lambda t: output("c", t)),
)


@settings(max_examples=80, deadline=None)
@given(st.lists(_item, min_size=1, max_size=12), st.data())
def test_projection_properties(items, data):
    boundary = data.draw(st.integers(1, len(items)))
    rec = record(items, boundary)
    tail = data.draw(st.lists(_item, max_size=4))
    payload = {"model": "gpt-5", "input": [*items, *tail]}
    before = copy.deepcopy(payload)
    for replay in (True, False):
        out, outcome = apply_projection(payload, ProjectionContext(rec, replay))
        assert payload == before
        assert outcome == ("remote" if replay else "fallback")
        assert out["input"][len(out["input"]) - len(items) - len(tail) + boundary:] == [*items, *tail][boundary:]
        assert project(out, ProjectionContext(rec, replay)) is out
        validate_if_available("CreateResponse", out)


# ---- fitting a bootstrap into a budget (issue 11) ----------------------------------------------------

def test_fit_input_drops_retained_oldest_first_and_keeps_item_and_tail():
    from proxy.items.inputs import items_bytes
    from proxy.windows.remote.bootstraps import fit_input

    retained = [user(f"r{i} " + "x" * 1_000) for i in range(5)]
    item = {"type": "compaction", "encrypted_content": "blob"}
    tail = [user("the newest ask")]
    whole = [*retained, item, *tail]
    assert fit_input([*retained, item], tail, items_bytes(whole)) == whole  # fits: unchanged
    fitted = fit_input([*retained, item], tail, items_bytes(whole) - 1_500)
    assert fitted == [*retained[2:], item, *tail]
    assert fit_input([*retained, item], tail, items_bytes([item, *tail])) == [item, *tail]
    assert fit_input([*retained, item], tail, 10) is None  # the item and the tail never give way


def test_fit_input_shrinks_the_fallback_excerpt_but_keeps_its_marker():
    from proxy.items.inputs import items_bytes
    from proxy.windows.remote.bootstraps import fit_input

    text = fallback_text("cp_fit", [user("y" * 20_000)])
    fb = fallback_message(text)
    tail = [user("ask")]
    fitted = fit_input([fb], tail, 3_000)
    assert fitted is not None and items_bytes(fitted) <= 3_000 and fitted[-1] == tail[0]
    assert is_fallback_message(fitted[0]) and marker("cp_fit") in fitted[0]["content"][0]["text"]
