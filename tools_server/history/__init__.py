"""The history tool family (seed 000): history_list_windows, history_list_items, history_read_item,
history_search_contents — over the proxy's journal in the state database."""

from __future__ import annotations

from tools_server.history.family import HistoryFamily
from tools_server.registry import Services


def create_family(services: Services) -> HistoryFamily:
    return HistoryFamily(services)
