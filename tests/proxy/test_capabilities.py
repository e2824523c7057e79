"""The one capability table (proxy/capabilities.py) is what config, status and the tool server use."""

from __future__ import annotations

from proxy.app.status import all_statuses
from proxy.capabilities import TABLE
from proxy.config import CAPABILITIES, Config
from tests.support.toolserver import make_services
from tools_server.families import build_registry


def test_every_capability_is_a_config_section_with_a_switch():
    config = Config()
    assert tuple(c.name for c in TABLE) == CAPABILITIES
    for cap in TABLE:
        assert isinstance(getattr(config, cap.name).enabled, bool), cap.name


def test_the_tool_server_registers_exactly_the_tools_the_table_names(tmp_path):
    overrides = {f"{c.name}.enabled": True for c in TABLE}
    registry = build_registry(make_services(tmp_path, overrides))
    registered: dict[str, set[str]] = {}
    for tool in registry.all_tools():  # registered (offered only where the capability can work here)
        registered.setdefault(tool.capability, set()).add(tool.name)
    for cap in TABLE:
        if cap.built:
            assert registered.get(cap.name, set()) == set(cap.tools), cap.name
        else:
            assert cap.name not in registered, f"{cap.name} registers tools but the table says it is not built"
    assert set(registered) <= {c.name for c in TABLE}


def test_status_says_unbuilt_capabilities_are_unavailable_and_why():
    config = Config()
    for cap in TABLE:
        getattr(config, cap.name).enabled = True
    states = {s.name: s for s in all_statuses(config)}
    for cap in TABLE:
        if not cap.built:
            assert states[cap.name].state == "unavailable" and "not built" in states[cap.name].reason
            assert cap.summary in states[cap.name].reason
