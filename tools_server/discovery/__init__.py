"""Tool discovery (seed 004 §5.8): `find_tools`, and the pure rule for what a bridged request carries."""

from tools_server.discovery.family import DiscoveryFamily, create_family, session_key
from tools_server.discovery.rules import carried_tool_names

__all__ = ["DiscoveryFamily", "carried_tool_names", "create_family", "session_key"]
