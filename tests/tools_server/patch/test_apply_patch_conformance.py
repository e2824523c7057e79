"""Codex's apply_patch scenarios, byte for byte, through the tool directly, over REST and over MCP."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.patch_conformance.harness import (
    TRANSPORTS,
    Apply,
    direct_applier,
    prepare,
    scenario_names,
    server_applier,
    snapshot,
)
from tests.support.toolserver import make_services

pytestmark = pytest.mark.timeout(90)  # a hung transport fails fast instead of after the suite default

# Scenarios whose patch must be refused (Codex exits non-zero on them).
FAILING = {
    "005_rejects_empty_patch",
    "006_rejects_missing_context",
    "007_rejects_missing_file_delete",
    "008_rejects_empty_update_hunk",
    "009_requires_existing_file_for_update",
    "012_delete_directory_fails",
    "013_rejects_invalid_hunk_header",
    "015_failure_after_partial_success_leaves_changes",
}

# Deliberate differences from Codex: name -> (expected tree, text the error must contain, reason).
DIFFERENCES: dict[str, tuple[dict[str, bytes], str, str]] = {
    "015_failure_after_partial_success_leaves_changes": (
        {},
        "missing.txt",
        "seed 004 §5.4: every predictable failure is found before any mutation, so the Add File "
        "before the failing Update is never committed (Codex's standalone applier leaves created.txt)",
    ),
}


@pytest.fixture(params=TRANSPORTS)
def applier(request: pytest.FixtureRequest, tmp_path: Path) -> Apply:
    if request.param == "direct":
        return direct_applier(lambda ws: make_services(tmp_path / "direct", {"apply_patch.enabled": True}, ws))
    return server_applier(request.getfixturevalue("tool_server"), request.param)


def test_every_scenario_is_covered() -> None:
    names = scenario_names()
    assert len(names) == 17
    assert set(DIFFERENCES) <= set(names) and set(names) >= FAILING


@pytest.mark.parametrize("name", scenario_names())
async def test_scenario(name: str, applier: Apply, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    patch, expected = prepare(name, workspace)
    outcome = await applier({"patch": patch}, workspace)
    if name in DIFFERENCES:
        expected, must_mention, _reason = DIFFERENCES[name]
        assert must_mention in outcome.text
    assert outcome.ok == (name not in FAILING), outcome.text
    assert snapshot(workspace) == expected
    if outcome.ok:
        assert outcome.text.startswith("Success. Updated the following files:")
    else:
        assert "Nothing was changed." in outcome.text


async def test_scenarios_through_heredoc_and_input_alias(applier: Apply, tmp_path: Path) -> None:
    """The same patch wrapped as models send it (heredoc), passed as Codex's JSON `input` field."""
    workspace = tmp_path / "ws"
    patch, expected = prepare("002_multiple_operations", workspace)
    wrapped = "apply_patch <<'EOF'\n" + patch + "EOF\n"
    outcome = await applier({"input": wrapped}, workspace)
    assert outcome.ok, outcome.text
    assert snapshot(workspace) == expected
    assert outcome.text.splitlines() == [
        "Success. Updated the following files:",
        "A nested/new.txt",
        "M modify.txt",
        "D delete.txt",
    ]
    ops = outcome.details["operations"]
    assert [(o["op"], o["status"]) for o in ops] == [("add", "committed"), ("delete", "committed"),
                                                     ("update", "committed")]
