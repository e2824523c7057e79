"""The embedded master loads only the mitmproxy addons ctproxy uses."""

from __future__ import annotations

from mitmproxy import options

from proxy.app.mitm_master import KEPT, build_master


async def test_only_the_kept_mitmproxy_addons_are_loaded() -> None:
    master = build_master(options.Options(), with_termlog=False)
    modules = {type(a).__module__.rsplit(".", 1)[-1] for a in master.addons.chain}
    assert modules == set(KEPT)
    assert master.addons.get("dumper") is None and master.addons.get("scriptloader") is None
    # What the launcher sets must exist: a missing addon would make these options unknown.
    master.options.update(connection_strategy="lazy", store_streamed_bodies=False, block_global=True,
                          server_replay_ignore_host=True, server_replay_extra="forward")
