"""`ctproxy status` and the config for code mode and tool discovery (issue 14): off by default, explained."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from proxy.app.status import capability_status
from proxy.capabilities import capability
from proxy.config import Config, ToolDiscoveryConfig


def test_both_are_built_and_off_by_default() -> None:
    config = Config()
    assert capability("code_mode").built and capability("tool_discovery").built
    for name in ("code_mode", "tool_discovery"):
        st = capability_status(config, name)
        assert st.state == "off" and f"ctproxy config set {name}.enabled true" in st.reason
    assert config.code_mode.memory_limit_mb == 64 and config.code_mode.approval_mode == "confirm"


def test_code_mode_status_says_it_is_remote_code_execution() -> None:
    config = Config()
    config.code_mode.enabled = True
    st = capability_status(config, "code_mode")
    assert st.state == "active" and "remote code execution" in st.reason and "64 MiB" in st.reason


def test_a_capability_discovery_holds_back_is_deferred() -> None:
    config = Config()
    config.tool_discovery.enabled = True
    config.apply_patch.enabled = True
    config.tool_discovery.deferred = ["apply_patch"]
    assert capability_status(config, "apply_patch").state == "deferred"
    assert "find_tools" in capability_status(config, "apply_patch").reason
    assert capability_status(config, "tool_discovery").state == "active"
    config.tool_discovery.enabled = False
    assert capability_status(config, "apply_patch").state == "active"


def test_the_computer_use_group_is_deferred_all_or_none() -> None:
    with pytest.raises(ValidationError, match="all six computer_use"):
        ToolDiscoveryConfig(deferred=["computer_use_click"])
    with pytest.raises(ValidationError, match="find_tools"):
        ToolDiscoveryConfig(deferred=["find_tools"])
    assert len(ToolDiscoveryConfig().deferred) == 7


def test_approval_mode_has_two_values() -> None:
    with pytest.raises(ValidationError):
        Config.model_validate({"code_mode": {"approval_mode": "sometimes"}})


def test_computer_use_held_by_discovery_is_deferred_not_active() -> None:
    """Seed 004 defect 10: status says `deferred` while discovery holds all six Computer Use tools."""
    config = Config()
    config.computer_use.enabled = True
    config.computer_use.display = ":99"
    config.computer_use.dbus_address = "unix:path=/nonexistent"
    config.tool_discovery.enabled = True
    st = capability_status(config, "computer_use")
    if st.state == "unavailable":
        pytest.skip(f"Computer Use cannot run on this machine ({st.reason}): nothing to hold back")
    assert st.state == "deferred" and "find_tools" in st.reason
    config.tool_discovery.deferred = []
    assert capability_status(config, "computer_use").state == "active"


def test_a_shell_that_cannot_run_is_unavailable(tmp_path) -> None:
    """Seed 004 defect 10: a nonexistent shell.shell or an unloadable shell.policy makes every call fail."""
    config = Config()
    config.shell.enabled = True
    assert capability_status(config, "shell").state == "active"
    config.shell.shell = str(tmp_path / "no-such-shell")
    st = capability_status(config, "shell")
    assert st.state == "unavailable" and "not an executable" in st.reason
    config.shell.shell = None
    config.shell.policy = "no_such_module_anywhere:Hooks"
    st = capability_status(config, "shell")
    assert st.state == "unavailable" and "cannot be loaded" in st.reason
    config.shell.policy = "tests.tools_server.test_one_road:Deny"
    assert capability_status(config, "shell").state == "active"
