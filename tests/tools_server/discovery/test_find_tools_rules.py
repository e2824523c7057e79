"""Tool discovery's pure rules (seed 004 §5.8): search and ranking, load re-checks and group rules, and what a
bridged request carries."""

from __future__ import annotations

from tools_server.discovery.rules import (
    COMPUTER_USE_GROUP,
    MAX_HITS,
    ToolEntry,
    carried_tool_names,
    check_deferred,
    load,
    search,
    summary,
)

ENTRIES = [
    ToolEntry("apply_patch", "Applies a patch to files in the workspace. Long text follows."),
    ToolEntry("exec_command", "Runs a shell command with plain pipes."),
    ToolEntry("write_stdin", "Writes characters to a running exec_command session."),
    ToolEntry("exec", "Runs JavaScript in a fresh V8 isolate."),
    ToolEntry("wait", "Waits for a running exec cell."),
    ToolEntry("openai_generate_image", "Generates an image.", unavailable="image_generation is off"),
    *[ToolEntry(n, f"Computer Use: {n.removeprefix('computer_use_').replace('_', ' ')} on the desktop.")
      for n in COMPUTER_USE_GROUP],
]
BY_NAME = {e.name: e for e in ENTRIES}


def test_summary_is_one_line() -> None:
    assert summary("Applies a patch. Then more.\nSecond line") == "Applies a patch."
    assert len(summary("x" * 500)) == 120


def test_search_ranks_names_before_descriptions_and_reports_status() -> None:
    hits = search("exec", ENTRIES, deferred={"exec", "wait"}, loaded=set())
    assert [h.name for h in hits][:2] == ["exec", "exec_command"]  # exact, then prefix
    assert "write_stdin" in [h.name for h in hits]  # the description mentions exec_command
    status = {h.name: h.status for h in hits}
    assert status["exec"] == "eligible" and status["exec_command"] == "active"
    image = search("image", ENTRIES, deferred={"openai_generate_image"}, loaded=set())
    assert image[0].status == "unavailable: image_generation is off"


def test_search_returns_at_most_eight() -> None:
    many = [ToolEntry(f"tool_{i}", "does a thing") for i in range(20)]
    assert len(search("thing", many, (), ())) == MAX_HITS
    assert search("   ", many, (), ()) == []
    assert search("nothing matches this", many, (), ()) == []


def test_load_adds_eligible_rejects_the_rest_and_reloading_is_a_no_op() -> None:
    deferred = {"exec", "wait", "apply_patch"}
    first = load(["apply_patch", "nope", "openai_generate_image"], BY_NAME, deferred | {"openai_generate_image"},
                 set())
    assert first.loaded == ("apply_patch",)
    assert dict(first.rejected) == {"nope": "not one of ctproxy's tools on this server",
                                    "openai_generate_image": "image_generation is off"}
    again = load(["apply_patch"], BY_NAME, deferred, first.session_loads)
    assert again.loaded == () and again.already == ("apply_patch",) and again.session_loads == first.session_loads
    never_deferred = load(["exec_command"], BY_NAME, deferred, set())
    assert never_deferred.already == ("exec_command",) and not never_deferred.session_loads


def test_computer_use_loads_all_six_or_none() -> None:
    deferred = set(COMPUTER_USE_GROUP)
    ok = load(["computer_use_click"], BY_NAME, deferred, set())
    assert set(ok.loaded) == set(COMPUTER_USE_GROUP)
    broken = dict(BY_NAME)
    broken["computer_use_scroll"] = ToolEntry("computer_use_scroll", "x", unavailable="computer_use is off")
    refused = load(["computer_use_click"], broken, deferred, set())
    assert refused.loaded == () and "loads together" in refused.rejected[0][1]


def test_pairs_need_both_members_eligible_but_activate_only_the_requested() -> None:
    deferred = {"exec", "wait"}
    one = load(["exec"], BY_NAME, deferred, set())
    assert one.loaded == ("exec",) and one.session_loads == {"exec"}
    broken = dict(BY_NAME)
    broken["wait"] = ToolEntry("wait", "x", unavailable="code_mode is off")
    refused = load(["exec"], broken, deferred, set())
    assert refused.loaded == () and "works only with wait" in refused.rejected[0][1]


def test_what_a_bridged_request_carries() -> None:
    enabled = ["apply_patch", "exec_command", "write_stdin", "openai_generate_image", "find_tools"]
    assert carried_tool_names(enabled, {"openai_generate_image"}, set(), discovery_on=False) == enabled[:4]
    on = carried_tool_names(enabled, {"openai_generate_image"}, set(), discovery_on=True)
    assert on == ["apply_patch", "exec_command", "write_stdin", "find_tools"]
    loaded = carried_tool_names(enabled, {"openai_generate_image"}, {"openai_generate_image"}, discovery_on=True)
    assert loaded == enabled
    # a load of a tool that is no longer enabled carries nothing
    assert "exec" not in carried_tool_names(enabled, {"exec"}, {"exec"}, discovery_on=True)


def test_deferred_list_rules() -> None:
    assert check_deferred(["openai_generate_image", *COMPUTER_USE_GROUP]) is None
    assert "all six Computer Use tools" in (check_deferred(["computer_use_click"]) or "")
    assert check_deferred(["find_tools"]) is not None
