"""Finding a chain addon by name, whether it was loaded alone (`mitmdump -s`) or as a stage of ctproxy's
chain addon (addons/chain_addon.py), which mitmproxy sees as one addon."""

from __future__ import annotations

from typing import Any

from mitmproxy import ctx

CHAIN_ADDON_NAME = "ctproxy-chain"


def find_addon(name: str) -> Any | None:
    """The running addon registered as `name` (lower-case class name), or None; None without a master."""
    try:
        manager = ctx.master.addons
    except Exception:  # no mitmproxy context (a unit test calling a hook directly)
        return None
    found = manager.get(name)
    if found is None and (chain := manager.get(CHAIN_ADDON_NAME)) is not None:
        found = chain.stage(name)
    return found
