"""Which tool families exist. Each module named here exposes `create_family(services) -> ToolFamily`."""

from __future__ import annotations

import importlib

from tools_server.registry import Registry, Services, ToolFamily

FAMILY_MODULES: tuple[str, ...] = (
    "tools_server.context",
    "tools_server.patch",
    "tools_server.shell",
    "tools_server.history", "tools_server.notes",
    "tools_server.image", "tools_server.search",
    "tools_server.computer_use",
    "tools_server.codemode",
    "tools_server.discovery",
)


def build_families(services: Services) -> list[ToolFamily]:
    families = []
    for module_name in FAMILY_MODULES:
        module = importlib.import_module(module_name)
        families.append(module.create_family(services))
    return families


def build_registry(services: Services) -> Registry:
    from proxy.app.status import capability_status
    from proxy.config import CAPABILITIES

    unavailable = {}
    for name in CAPABILITIES:
        st = capability_status(services.config, name, services.upstream_official, services.upstream_trusted)
        if st.state == "unavailable":
            unavailable[name] = st.reason
    registry = Registry(build_families(services), services.config, unavailable)
    # code mode dispatches nested calls and find_tools searches through the registry itself
    services.extras["registry"] = registry
    return registry
