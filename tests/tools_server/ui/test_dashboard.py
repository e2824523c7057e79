"""The dashboard (issue 17) in a real browser: Debian's chromium driven by Playwright for Python.

`ctproxy up` prints a one-time login link; opening it sets an HttpOnly cookie and lands on /ui/ with no
secret in the URL. A request made with the `openai` SDK appears live (SSE); a compacted session's page has
a plot with one point per request and a marker for the window the compaction opened; without the cookie
(the token in a URL does not count) the API says 401, and a page of another origin cannot read it.
Screenshots are saved under the test's tmp dir."""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.proxy.app.test_cli_views import TURNS, drive_compacted_session, write_config
from tests.support.optional import require_tool

CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--disable-sync", "--no-first-run"]
API_KEY = "sk-live-SECRET-dashboard-key"
LOGIN = re.compile(r"dashboard\s+(http://\S+/ui/login\?code=\S+)")

playwright_api = pytest.importorskip("playwright.async_api", reason="playwright is a test dependency (pyproject)")


@pytest.fixture
async def browser():
    require_tool("chromium", Path(CHROMIUM), "Debian's chromium")
    async with playwright_api.async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS, headless=True)
        yield b
        await b.close()


def _login_link(log: str) -> str:
    m = LOGIN.search(log)
    assert m, f"no login link in the banner:\n{log}"
    return m[1]


async def test_dashboard_in_a_browser(emulator, proxy_factory, browser, tmp_path):
    state = tmp_path / "state-ui"
    write_config(state)
    proxy = await proxy_factory(upstream=emulator.url, state_dir=state)
    token = (state / "token").read_text().strip()
    link = _login_link(proxy.log())
    assert token not in link

    context = await browser.new_context(viewport={"width": 1400, "height": 1000})
    page = await context.new_page()
    await page.goto(link)
    assert page.url == proxy.tools_url + "/ui/"  # no code, no token in the page's URL any more
    cookies = await context.cookies()
    assert [(c["name"], c["httpOnly"], c["sameSite"]) for c in cookies] == [("ctproxy_ui", True, "Strict")]
    await page.wait_for_selector("#live.on", timeout=30_000)

    # A request made with the openai SDK appears live.
    client = AsyncOpenAI(base_url=proxy.url + "/v1", api_key=API_KEY, max_retries=0)
    await client.responses.create(model="gpt-5", input="hello dashboard")
    row = await page.wait_for_selector('#requests-body tr.request[data-path="/v1/responses"]', timeout=30_000)
    assert "200" in (await row.inner_text())
    await row.click()
    assert "injected the hosted web_search tool" in await page.inner_text("#request-detail")
    await page.click("#show-diff")  # the replay diff, live: what the chain changed in this body
    await page.wait_for_function("document.getElementById('request-diff').textContent.includes('web_search')",
                                 timeout=30_000)
    assert "+" in await page.inner_text("#request-diff")
    await page.wait_for_selector('#status tr[data-capability="web_search"]')
    await page.screenshot(path=str(tmp_path / "dashboard-overview.png"), full_page=True)

    # A session compacted once: its plot has one point per request and a marker for the new window.
    await drive_compacted_session(proxy.url)
    await page.wait_for_function(
        f"document.querySelectorAll('#requests-body tr.request').length >= {TURNS + 1}", timeout=60_000)
    bearer = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as http, http.get(proxy.tools_url + "/ui/api/tasks", headers=bearer) as r:
        tasks = (await r.json())["data"]
    session = next(s for t in tasks for a in t["agents"] for s in a["sessions"] if s["responses"] == TURNS)
    await page.goto(proxy.tools_url + "/ui/#/session/" + session["session_key"])
    plot = await page.wait_for_selector("#plot canvas", timeout=30_000)
    assert plot is not None
    holder = await page.query_selector("#plot")
    assert await holder.get_attribute("data-points") == str(TURNS)
    assert await holder.get_attribute("data-window-markers") == "1"  # the window the compaction opened
    assert "remote" in await page.inner_text("#session-plot .marker-list")
    # issue 47: the session's cached share of input tokens, per window too (the emulator models the cache)
    cache = await page.wait_for_selector("#session-cache", timeout=30_000)
    assert float(await cache.get_attribute("data-cached-share") or "0") > 0.5, await cache.inner_text()
    assert "% of" in await page.inner_text("#session-cache .cache-summary")
    assert len(await page.query_selector_all("#session-cache tr.cache-row")) == 2  # the window before and after
    await page.screenshot(path=str(tmp_path / "dashboard-session.png"), full_page=True)
    rows = await page.query_selector_all("tr.item")
    assert rows
    await rows[0].click()
    await page.wait_for_selector("#item-detail pre")

    # Without the cookie nothing is readable, the token in a URL included; the link was one-time.
    bare = await browser.new_context()
    other = await bare.new_page()
    resp = await other.goto(proxy.tools_url + f"/ui/?token={token}")
    assert resp is not None and resp.status == 401
    resp = await other.goto(proxy.tools_url + "/ui/api/tasks")
    assert resp is not None and resp.status == 401
    resp = await other.goto(link)
    assert resp is not None and resp.status == 403  # already used

    # A page of another origin (same site: 127.0.0.1, another port) cannot read the API with the cookie.
    await page.goto(emulator.url + "/v1/models")
    read = await page.evaluate("""async (url) => {
        try { const r = await fetch(url, {credentials: "include"}); return "read " + r.status + " " + await r.text(); }
        catch (e) { return "blocked"; } }""", proxy.tools_url + "/ui/api/tasks")
    assert read == "blocked"
    cookie = {c["name"]: c["value"] for c in await context.cookies()}
    async with aiohttp.ClientSession(cookies=cookie) as http:
        async with http.get(proxy.tools_url + "/ui/api/tasks") as r:
            assert r.status == 200  # the cookie alone works from this server's own pages …
        async with http.get(proxy.tools_url + "/ui/api/tasks", headers={"Origin": emulator.url}) as r:
            assert r.status == 403  # … and never for another origin

        # Nothing secret in the dashboard's API: no credential, no token.
        texts = []
        for path in ("/ui/api/requests", "/ui/api/tasks", "/ui/api/tools", "/ui/api/status",
                     f"/ui/api/sessions/{session['session_key']}"):
            async with http.get(proxy.tools_url + path) as r:
                assert r.status == 200, path
                texts.append(await r.text())
    blob = "\n".join(texts)
    for needle in (API_KEY, "sk-test-views", token, "SECRET"):
        assert needle not in blob, needle
    json.loads(texts[0])
    await client.close()
    await bare.close()
    await context.close()
    await proxy.astop()
    assert API_KEY not in proxy.log() and token not in proxy.log()
    shots = sorted(p.name for p in tmp_path.glob("dashboard-*.png"))
    assert shots == ["dashboard-overview.png", "dashboard-session.png"]
