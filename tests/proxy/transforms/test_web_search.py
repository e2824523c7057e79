"""Native web search: the pure transform and the decision (seed 004 §5.1)."""

from __future__ import annotations

import copy
import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.config import WebSearchConfig
from proxy.transforms.web_search import (
    SOURCES_INCLUDE,
    WebSearchSettings,
    decide_native,
    inject_web_search,
    is_web_search_tool,
    native_status,
)
from tests.openapi_schema import spec_available, validate

LIVE = WebSearchSettings()

FUNCTION_TOOL = {"type": "function", "name": "get_weather", "description": "w", "strict": True,
                 "parameters": {"type": "object", "properties": {}, "required": [], "additionalProperties": False}}

# The capability turned on explicitly, whatever the default: what these tests are about.
ON = functools.partial(WebSearchConfig, enabled=True)


def base(**extra):
    return {"model": "gpt-5", "input": [{"role": "user", "content": "hi"}], **extra}


def test_injects_tool_and_include_when_absent():
    payload = base()
    out = inject_web_search(payload, LIVE)
    assert out is not payload
    assert out["tools"] == [{"type": "web_search"}]
    assert out["include"] == [SOURCES_INCLUDE]
    assert payload == base()  # input untouched


def test_appends_after_client_tools_and_keeps_their_order():
    payload = base(tools=[FUNCTION_TOOL], include=["reasoning.encrypted_content"])
    out = inject_web_search(payload, LIVE)
    assert out["tools"] == [FUNCTION_TOOL, {"type": "web_search"}]
    assert out["include"] == ["reasoning.encrypted_content", SOURCES_INCLUDE]


@pytest.mark.parametrize("spelling", [
    {"type": "web_search"},
    {"type": "web_search", "external_web_access": False},
    {"type": "web_search_preview"},
    {"type": "web_search_2025_08_26", "search_context_size": "low"},
    {"type": "web_search_preview_2025_03_11"},
])
def test_client_web_search_tool_wins_and_is_never_rewritten(spelling):
    client_tool = copy.deepcopy(spelling)
    payload = base(tools=[FUNCTION_TOOL, client_tool])
    out = inject_web_search(payload, WebSearchSettings("cached", "high"))
    assert out["tools"] == [FUNCTION_TOOL, spelling]  # no second search tool, the client's as it was
    assert out["tools"][1] is client_tool
    assert out["include"] == [SOURCES_INCLUDE]


def test_not_web_search_lookalikes():
    assert not is_web_search_tool({"type": "web_search_call"})
    assert not is_web_search_tool({"type": "function", "name": "web_search"})
    assert not is_web_search_tool({"type": "web_searcher"})
    assert is_web_search_tool({"type": "web_search_preview_2025_03_11"})


def test_function_named_web_search_does_not_block_injection():
    fn = {**FUNCTION_TOOL, "name": "web_search"}
    out = inject_web_search(base(tools=[fn]), LIVE)
    assert out["tools"] == [fn, {"type": "web_search"}]


def test_include_merge_has_no_duplicates():
    payload = base(tools=[{"type": "web_search"}], include=[SOURCES_INCLUDE, "reasoning.encrypted_content"])
    assert inject_web_search(payload, LIVE) is payload


def test_returns_same_object_when_nothing_to_do():
    payload = base(tools=[{"type": "web_search_preview"}], include=[SOURCES_INCLUDE])
    assert inject_web_search(payload, LIVE) is payload


def test_idempotent():
    once = inject_web_search(base(tools=[FUNCTION_TOOL]), LIVE)
    twice = inject_web_search(once, LIVE)
    assert twice is once


def test_keeps_tool_choice_and_unknown_fields():
    payload = base(tool_choice={"type": "function", "name": "get_weather"}, tools=[FUNCTION_TOOL],
                   x_future_field={"nested": [1, 2]}, store=False, stream=True)
    out = inject_web_search(payload, LIVE)
    for key in ("tool_choice", "x_future_field", "store", "stream", "model", "input"):
        assert out[key] == payload[key]
        assert out[key] is payload[key]


def test_mode_and_context_size_map_to_tool_fields():
    assert WebSearchSettings("cached", "low").tool_spec() == {
        "type": "web_search", "external_web_access": False, "search_context_size": "low"}
    assert WebSearchSettings("live", "high").tool_spec() == {"type": "web_search", "search_context_size": "high"}
    assert WebSearchSettings("live", None).tool_spec() == {"type": "web_search"}


def test_shapes_it_does_not_understand_are_left_alone():
    weird_tools = base(tools={"type": "web_search"})
    assert inject_web_search(weird_tools, LIVE) is weird_tools
    weird_include = base(include="web_search_call.action.sources")
    assert inject_web_search(weird_include, LIVE) is weird_include


# ---- decision -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("cfg", "eligible", "last", "apply", "reason"), [
    (ON(), True, None, True, "native"),
    (ON(), False, None, False, "route"),
    (ON(backend="native"), True, 10, True, "native"),
    (ON(backend="native"), False, None, False, "route"),
    (ON(backend="off"), True, None, False, "off"),
    (ON(enabled=False), True, None, False, "off"),
    (ON(backend="sidecar"), True, None, False, "sidecar"),
    (ON(), True, 128_000, True, "native"),
    (ON(), True, 128_001, False, "input_tokens"),
    (ON(max_input_tokens=1000), True, 1001, False, "input_tokens"),
])
def test_decision(cfg, eligible, last, apply, reason):
    d = decide_native(cfg, eligible, last)
    assert (d.apply, d.reason) == (apply, reason)


def test_status_wording():
    assert native_status(ON(), True, False)[0] == "active"
    state, why = native_status(ON(), False, False)
    assert state == "unavailable" and "sidecar" in why  # issue 15: `deferred` is for tool discovery only
    assert native_status(ON(backend="native"), False, False)[0] == "unavailable"
    assert native_status(ON(backend="native"), False, True)[0] == "active"
    assert native_status(ON(backend="off"), True, False)[0] == "off"


def test_status_names_the_switch_that_is_off_and_the_promises():
    """Defect 13: `enabled: false` is named as such (the backend is still auto); and the active line says it
    is injected because it was turned on, what it costs, the one search path, the conflict and the client's switch."""
    state, why = native_status(ON(enabled=False), True, False)
    assert state == "off" and "web_search.enabled is false" in why and "backend" not in why
    state, why = native_status(ON(backend="off"), True, False)
    assert state == "off" and "web_search.backend is off" in why
    state, why = native_status(ON(), True, False)
    for words in ("web_search.enabled is on", "billed", "one Toolkit search path", "conflict",
                  "x-ctp-web-search: off"):
        assert words in why, words


# ---- issue 31: what the injection may not change, and one search path per turn ----------------------------

SIDECAR_FN = {"type": "function", "name": "openai_web_search",
              "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}
CODEX_NAMESPACE = {"type": "namespace", "name": "mcp__ctproxy", "description": "ctproxy", "tools": [SIDECAR_FN]}
SIDECAR_CFG = ON(sidecar_model="gpt-5-mini")


@pytest.mark.parametrize(("choice", "apply", "reason"), [
    (None, True, "native"),
    ("auto", True, "native"),
    ("required", False, "tool_choice"),  # defect 8: a web search alone would meet "required"
    ({"type": "function", "name": "get_weather"}, False, "tool_choice"),
    ({"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_weather"}]},
     False, "tool_choice"),
    ({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "get_weather"}]},
     False, "tool_choice"),
    ({"type": "web_search"}, True, "native"),  # a choice of the hosted tool itself
    ("none", False, "tool_choice_none"),
])
def test_the_injection_never_changes_what_tool_choice_means(choice, apply, reason):
    payload = base(tools=[FUNCTION_TOOL]) if choice is None else base(tools=[FUNCTION_TOOL], tool_choice=choice)
    d = decide_native(ON(), True, None, payload)
    assert (d.apply, d.reason) == (apply, reason)


def test_a_client_function_named_web_search_is_a_conflict_and_the_request_is_left_alone():
    """Defect 10: two tools by one name would leave the model unable to tell them apart; nothing is renamed
    (seed 004 §5.1: the Toolkit never disables or replaces another's tool), and nothing is injected."""
    for tool in ({**FUNCTION_TOOL, "name": "web_search"}, {"type": "custom", "name": "web_search"}):
        d = decide_native(ON(), True, None, base(tools=[tool]))
        assert (d.apply, d.reason) == (False, "name_conflict")
    lite = base(input=[{"type": "additional_tools", "role": "developer", "tools": [{**FUNCTION_TOOL,
                                                                                     "name": "web_search"}]},
                       {"role": "user", "content": "hi"}])
    assert decide_native(ON(), True, None, lite).reason == "name_conflict"
    # a namespaced tool of that name is called by its namespace: no conflict
    ns = {"type": "namespace", "name": "mcp__other", "tools": [{**FUNCTION_TOOL, "name": "web_search"}]}
    assert decide_native(ON(), True, None, base(tools=[ns])).apply


@pytest.mark.parametrize("where", ["top", "namespace", "additional_tools"])
def test_one_search_path_per_turn_sees_the_sidecar_wherever_the_client_lists_it(where):
    """Defect 3: Codex lists ctproxy's MCP tools inside a namespace (or, responses-lite, in a leading
    additional_tools item): that is the sidecar too, and the turn gets no native search beside it."""
    if where == "top":
        payload = base(tools=[SIDECAR_FN])
    elif where == "namespace":
        payload = base(tools=[CODEX_NAMESPACE])
    else:
        payload = base(input=[{"type": "additional_tools", "role": "developer", "tools": [CODEX_NAMESPACE]},
                              {"role": "user", "content": "hi"}])
    for cfg in (SIDECAR_CFG, ON()):
        d = decide_native(cfg, True, None, payload)
        assert (d.apply, d.reason) == (False, "sidecar")
    # backend native offers no sidecar: a tool of that name is no Toolkit path, the forced native path stays
    assert decide_native(ON(backend="native"), True, None, payload).apply


def test_additional_tools_count_for_the_dedupe_and_the_item_is_not_changed():
    item = {"type": "additional_tools", "role": "developer", "tools": [{"type": "web_search"}]}
    payload = base(input=[item, {"role": "user", "content": "hi"}], include=[SOURCES_INCLUDE])
    assert inject_web_search(payload, LIVE) is payload
    payload = base(input=[item, {"role": "user", "content": "hi"}])
    out = inject_web_search(payload, LIVE)
    assert "tools" not in out and out["include"] == [SOURCES_INCLUDE] and out["input"][0] is item


def test_the_client_says_off_per_request():
    d = decide_native(ON(), True, None, base(), switch="off")
    assert (d.apply, d.reason) == (False, "client_off")
    assert decide_native(ON(), True, None, base(), switch="on").apply


# ---- the forwarded payload stays a valid CreateResponse -----------------------------------------

_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "developer"]),
                           "content": st.text(max_size=30)}),
    min_size=1, max_size=4,
)
_tools = st.lists(st.sampled_from([
    FUNCTION_TOOL,
    {"type": "web_search"},
    {"type": "web_search_preview"},
    {"type": "web_search_2025_08_26"},
    {"type": "web_search", "search_context_size": "high", "external_web_access": False},
]), max_size=3, unique_by=lambda t: repr(t))
_include = st.lists(st.sampled_from([SOURCES_INCLUDE, "reasoning.encrypted_content", "web_search_call.results"]),
                    max_size=3, unique=True)


@settings(max_examples=60, deadline=None)
@given(_messages, _tools, _include, st.sampled_from(["live", "cached"]), st.sampled_from([None, "low", "high"]),
       st.sampled_from(["auto", "none", "required"]))
def test_forwarded_payload_validates_and_transform_is_idempotent(messages, tools, include, mode, size, choice):
    payload = {"model": "gpt-5", "input": messages, "tool_choice": choice}
    if tools:
        payload["tools"] = tools
    if include:
        payload["include"] = include
    before = copy.deepcopy(payload)
    out = inject_web_search(payload, WebSearchSettings(mode, size))
    assert payload == before
    if spec_available():  # the official OpenAPI description is in ../shared: a user's clone checks the rest
        validate("CreateResponse", out)
    assert inject_web_search(out, WebSearchSettings(mode, size)) is out
    assert sum(1 for t in out["tools"] if is_web_search_tool(t)) == max(1, sum(is_web_search_tool(t) for t in tools))
    assert out["include"].count(SOURCES_INCLUDE) == 1
    assert out["tool_choice"] == choice
