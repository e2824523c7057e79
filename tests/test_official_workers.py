"""`ctproxy up --workers 2` on the default upstream (https://api.openai.com/v1, issue 43) and in HTTPS proxy
(regular) mode. Reverse mode to an `https` upstream has mitmproxy's transport `both` (TCP, and HTTP/3 over UDP
on the same port): before the fix worker 2 failed with "address already in use" and `ctproxy up` exited. Here
nothing is sent anywhere: the test only starts ctproxy and reads which sockets each worker holds (a request
through both workers to the official route runs inside the private network in tests/test_official_route.py)."""

from __future__ import annotations

import json

import psutil
import pytest

from proxy.workers import supported

pytestmark = [pytest.mark.skipif(supported() is not None, reason=str(supported())), pytest.mark.timeout(240)]


def _sockets(pid: int) -> tuple[set[int], set[int]]:
    """(TCP ports listened on, UDP ports bound) by process `pid` itself."""
    conns = psutil.Process(pid).net_connections(kind="inet")
    tcp = {c.laddr.port for c in conns if c.type == 1 and c.status == psutil.CONN_LISTEN}
    udp = {c.laddr.port for c in conns if c.type == 2}
    return tcp, udp


@pytest.mark.parametrize("mode", ["reverse", "regular"])
async def test_two_workers_start_on_the_default_upstream(proxy_factory, mode):
    proxy = await proxy_factory(upstream=None, trust_upstream=False, mode=mode, with_tools=False,
                                extra_args=["--workers", "2"])
    run = json.loads((proxy.state_dir / "run.json").read_text())
    assert len(run["workers"]) == 2, run
    if mode == "reverse":
        assert run["upstream"].startswith("official"), run["upstream"]
    socks = {w["index"]: _sockets(w["pid"]) for w in run["workers"]}
    assert all(proxy.port in tcp for tcp, _ in socks.values()), socks  # both serve the one TCP address
    if mode == "reverse":  # HTTP/3 (UDP) on the same port: worker 1 only (mitm_master.share_listen_port)
        assert proxy.port in socks[1][1] and proxy.port not in socks[2][1], socks
    else:
        assert not socks[1][1] and not socks[2][1], socks
