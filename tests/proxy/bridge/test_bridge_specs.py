"""Which bridged tools a request gets and how they are appended (proxy/bridge/specs.py, pure), and the bridge
off leaving requests byte for byte unchanged (issue 12)."""

from __future__ import annotations

import orjson

from proxy.bridge.specs import append_specs, select
from proxy.toolclient import BridgeTool


def tool(name: str, family: str = "notes", custom: dict | None = None, available: bool = True,
         parallel: bool = True) -> BridgeTool:
    fn = {"type": "function", "name": name, "description": f"{name} tool", "strict": True,
          "parameters": {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}},
                         "required": ["a", "b"], "additionalProperties": False}}
    return BridgeTool(name, family, family, parallel, available, "" if available else "no workspace", fn, custom)


REGISTRY = [tool("get_context_remaining", "context"), tool("notes_read_file"), tool("notes_write_file", parallel=False),
            tool("apply_patch", "apply_patch", custom={"type": "custom", "name": "apply_patch", "description": "p",
                                                       "format": {"type": "grammar", "syntax": "lark",
                                                                  "definition": "start: x"}}),
            tool("exec_command", "shell", available=False)]


def test_only_bridged_families_after_the_agents_tools():
    agent = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    payload = {"model": "gpt-4.1", "input": "hi", "tools": [agent]}
    offer = select(REGISTRY, ["notes", "shell"], payload)
    assert [t.name for t in offer.tools] == ["notes_read_file", "notes_write_file"]
    assert ("exec_command", "no workspace") in offer.left_out
    out = append_specs(payload, offer)
    assert out["tools"][0] is agent and [t["name"] for t in out["tools"][1:]] == ["notes_read_file", "notes_write_file"]
    assert payload["tools"] == [agent]  # the input is not changed in place
    assert append_specs(out, select(REGISTRY, ["notes", "shell"], out, ours=offer.specs)) is out  # idempotent


def test_an_agent_tool_of_the_same_name_wins():
    mine = {"type": "function", "name": "notes_read_file", "parameters": {"type": "object"}}
    offer = select(REGISTRY, ["notes"], {"model": "m", "tools": [mine]})
    assert [t.name for t in offer.tools] == ["notes_write_file"]
    assert ("notes_read_file", "the agent has its own tool of that name") in offer.left_out
    hosted = select(REGISTRY, ["apply_patch"], {"model": "gpt-5", "tools": [{"type": "apply_patch"}]})
    assert not hosted.tools


def test_apply_patch_in_the_form_the_model_expects():
    gpt5 = select(REGISTRY, ["apply_patch"], {"model": "gpt-5.1-codex"})
    assert gpt5.forms["apply_patch"] == "custom" and gpt5.specs[0]["type"] == "custom"
    other = select(REGISTRY, ["apply_patch"], {"model": "gpt-4.1"})
    assert other.forms["apply_patch"] == "function" and other.specs[0]["type"] == "function"
    forced = select(REGISTRY, ["apply_patch"], {"model": "gpt-5"}, apply_patch_form="function")
    assert forced.specs[0]["type"] == "function"


PAIRS = [tool("exec", "code_mode"), tool("wait", "code_mode"), tool("exec_command", "shell"),
         tool("write_stdin", "shell"), tool("find_tools", "tool_discovery"), tool("notes_read_file"),
         tool("computer_use_click", "computer_use")]


def test_atomic_groups_are_offered_whole_or_not_at_all():
    """Seed 004 defect 12: an agent with its own `wait` (or `exec_command`) gets neither half of our pair."""
    both = select(PAIRS, ["code_mode", "shell"], {"model": "m"})
    assert [t.name for t in both.tools] == ["exec", "wait", "exec_command", "write_stdin"]
    own = [{"type": "function", "name": "wait", "parameters": {"type": "object"}},
           {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]
    offer = select(PAIRS, ["code_mode", "shell"], {"model": "m", "tools": own})
    assert offer.tools == () and offer.specs == ()
    why = dict(offer.left_out)
    assert why["exec"].startswith("offered only together with wait") and "its own tool" in why["exec"]
    assert why["write_stdin"].startswith("offered only together with exec_command")


def test_an_agents_own_find_tools_does_not_strand_the_deferred_tools():
    """Seed 004 defect 12: discovery holds back deferred tools only while our find_tools can load them."""
    carried = frozenset({"find_tools", "notes_read_file"})
    ours = select(PAIRS, ["tool_discovery", "notes", "computer_use"], {"model": "m"}, carried=carried)
    assert [t.name for t in ours.tools] == ["find_tools", "notes_read_file"]
    own = [{"type": "function", "name": "find_tools", "parameters": {"type": "object"}}]
    offer = select(PAIRS, ["tool_discovery", "notes", "computer_use"], {"model": "m", "tools": own},
                   carried=carried)
    assert [t.name for t in offer.tools] == ["notes_read_file", "computer_use_click"]


def test_specs_are_byte_stable_whatever_the_source_order():
    shuffled = [BridgeTool(t.name, t.family, t.capability, t.parallel, t.available, t.reason,
                           dict(reversed(list(t.function.items()))), t.custom) for t in REGISTRY]
    a = append_specs({"model": "m", "input": "1"}, select(REGISTRY, ["notes", "context"], {"model": "m"}))
    b = append_specs({"model": "m", "input": "2"}, select(shuffled, ["notes", "context"], {"model": "m"}))
    assert orjson.dumps(a["tools"]) == orjson.dumps(b["tools"])


async def test_bridge_off_leaves_the_request_byte_for_byte(rt):
    """With no family bridged the stage returns before parsing: the request, its body and its destination are
    untouched (and with families set, the same request is changed: the test can fail)."""
    from mitmproxy.test import tflow

    from addons.bridge import Bridge
    from proxy.host.flowstate import state_of

    raw = b'{"model":"gpt-4.1",  "input":[{"role":"user","content":"hi"}], "tools":[], "zz_unknown":{"b":1,"a":2}}'
    flow = tflow.tflow()
    flow.request.method, flow.request.path = "POST", "/v1/responses"
    flow.request.headers["content-type"] = "application/json"
    flow.request.raw_content = raw
    before = (flow.request.url, tuple(flow.request.headers.fields))
    stage = Bridge()
    await stage.request(flow)
    assert flow.request.raw_content == raw and (flow.request.url, tuple(flow.request.headers.fields)) == before
    assert not state_of(flow).body_checked  # not even parsed
    rt.config.bridge.families = ["context"]
    await stage.request(flow)  # bridged but no tool server in this runtime: parsed, still not re-routed
    assert state_of(flow).body_checked
