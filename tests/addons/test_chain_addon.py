"""The chain as one mitmproxy addon: same order and semantics as separate addons, one dispatch."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from mitmproxy import exceptions
from mitmproxy.proxy.layers.http import HttpRequestHook
from mitmproxy.test import taddons, tflow

from addons.chain_addon import ChainAddon
from proxy.host.addonlookup import find_addon


class Recorder:
    def __init__(self, name: str, log: list[str]):
        self.name = name
        self.log = log

    def request(self, flow) -> None:
        self.log.append(f"{self.name}.request")


class AsyncStage(Recorder):
    def request(self, flow):
        async def later() -> None:
            await asyncio.sleep(0)
            self.log.append(f"{self.name}.request(async)")

        return later()


class Failing(Recorder):
    def request(self, flow) -> None:
        self.log.append(f"{self.name}.request")
        raise RuntimeError("boom")


class Halting(Recorder):
    def request(self, flow) -> None:
        self.log.append(f"{self.name}.request")
        raise exceptions.AddonHalt()


def test_sync_stages_run_in_order_without_a_coroutine() -> None:
    log: list[str] = []
    chain = ChainAddon([Recorder("a", log), Recorder("b", log)])
    assert chain.request(tflow.tflow()) is None  # stays synchronous: nothing to await
    assert log == ["a.request", "b.request"]


async def test_an_async_stage_continues_the_rest_in_order() -> None:
    log: list[str] = []
    chain = ChainAddon([Recorder("a", log), AsyncStage("b", log), Recorder("c", log), AsyncStage("d", log)])
    pending = chain.request(tflow.tflow())
    assert log == ["a.request"]  # b returned an awaitable: c must wait for it
    assert pending is not None
    await pending
    assert log == ["a.request", "b.request(async)", "c.request", "d.request(async)"]


async def test_a_failing_stage_is_logged_and_the_next_still_runs(caplog) -> None:
    log: list[str] = []
    chain = ChainAddon([Failing("a", log), AsyncStage("b", log), Failing("c", log), Recorder("guard", log)])
    with caplog.at_level(logging.ERROR):
        await chain.request(tflow.tflow())
    assert log == ["a.request", "b.request(async)", "c.request", "guard.request"]
    assert sum("addon error in" in r.getMessage() for r in caplog.records) == 2


def test_addon_halt_stops_the_event() -> None:
    log: list[str] = []
    chain = ChainAddon([Halting("a", log), Recorder("b", log)])
    with pytest.raises(exceptions.AddonHalt):
        chain.request(tflow.tflow())
    assert log == ["a.request"]


def test_stages_are_found_by_name_through_the_chain_addon() -> None:
    log: list[str] = []
    first, second = Recorder("first", log), Recorder("second", log)
    with taddons.context(ChainAddon([first, second]), loadcore=False):
        assert find_addon("first") is first
        assert find_addon("second") is second
        assert find_addon("absent") is None


async def test_mitmproxy_dispatches_to_the_chain_once_per_event() -> None:
    log: list[str] = []
    with taddons.context(ChainAddon([Recorder("a", log), AsyncStage("b", log)]), loadcore=False) as tctx:
        await tctx.master.addons.handle_lifecycle(HttpRequestHook(tflow.tflow()))
    assert log == ["a.request", "b.request(async)"]


def test_a_stage_with_a_hook_the_chain_does_not_forward_is_an_error() -> None:
    """Silently dropping it would make a stage work alone (`mitmdump -s`) and do nothing in the chain."""

    class Watcher:
        def request(self, flow: Any) -> None:
            pass

        def dns_request(self, flow: Any) -> None:
            pass

    with pytest.raises(TypeError, match="dns_request"):
        ChainAddon([Watcher()])
