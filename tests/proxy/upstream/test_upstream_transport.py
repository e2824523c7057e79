"""The upstream-turn service's transport (proxy/upstream/transport.py) against a real aiohttp server."""

from __future__ import annotations

from aiohttp import web

from proxy.upstream.transport import AiohttpTransport, UpstreamRequest


async def test_a_cookie_an_answer_sets_never_rides_on_a_later_call():
    seen: list[str | None] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Cookie"))
        resp = web.json_response({"ok": True})
        resp.set_cookie("upstream_session", "of-another-agent")
        return resp

    app = web.Application()
    app.router.add_post("/v1/responses", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    transport = AiohttpTransport()
    try:
        for headers in ((), (("cookie", "mine=1"),)):
            # a host name, as upstreams have (aiohttp never keeps cookies of a bare IP address anyway)
            req = UpstreamRequest("POST", f"http://localhost:{port}/v1/responses", headers, b"{}", False)
            async with transport.open(req, 10) as answer:
                assert answer.status == 200
                async for _ in answer.chunks:
                    pass
    finally:
        await transport.close()
        await runner.cleanup()
    assert seen == [None, "mine=1"]  # the agent's own cookie passes; the upstream's is not kept
