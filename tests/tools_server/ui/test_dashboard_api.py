"""The dashboard's API in process (issue 17): who may read it, the one-time login, tool calls with their
outcome and error text, and the shell jobs running now."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import aiohttp

from tools_server.ui import COOKIE

SHELL = {"shell.enabled": True}


async def _login(srv: Any, http: aiohttp.ClientSession) -> str:
    """A one-time link minted with the bearer token (what `ctproxy dashboard` does), opened once."""
    async with http.post(srv.url + "/ui/login-codes", headers=srv.headers()) as r:
        assert r.status == 200
        url = (await r.json())["url"]
    assert re.fullmatch(rf"{srv.url}/ui/login\?code=[A-Za-z0-9_-]+", url), url
    async with http.get(url, allow_redirects=False) as r:
        assert r.status == 303 and r.headers["Location"] == "/ui/"
        cookie = r.cookies[COOKIE]
        assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/ui"
    async with http.get(url, allow_redirects=False) as r:
        assert r.status == 403  # one time only
    return url


async def test_who_may_read_the_dashboard(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server()
    async with aiohttp.ClientSession() as anon:
        for path in ("/ui/api/tasks", "/ui/api/status", "/ui/api/events", f"/ui/api/tasks?token={srv.token}"):
            async with anon.get(srv.url + path) as r:
                assert r.status == 401, path
        async with anon.get(srv.url + f"/ui/?token={srv.token}") as r:
            assert r.status == 401 and "ctproxy dashboard" in await r.text()
        async with anon.get(srv.url + "/ui/static/app.js") as r:
            assert r.status == 401  # even the page's code needs the session
        async with anon.get(srv.url + "/ui/login?code=guess") as r:
            assert r.status == 403
        async with anon.post(srv.url + "/ui/login-codes") as r:
            assert r.status == 401
        async with anon.get(srv.url + "/ui/api/tasks", headers={**srv.headers(), "Host": "evil.example"}) as r:
            assert r.status == 403  # DNS rebinding
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for an IP-address host
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        await _login(srv, http)
        async with http.get(srv.url + "/ui/") as r:
            assert r.status == 200 and '<script type="module"' in await r.text()
        async with http.get(srv.url + "/ui/static/vendor/uPlot.esm.js") as r:
            assert r.status == 200 and "javascript" in r.headers["Content-Type"]
        async with http.get(srv.url + "/ui/api/tasks") as r:
            assert r.status == 200
        async with http.get(srv.url + "/ui/api/tasks", headers={"Origin": srv.url}) as r:
            assert r.status == 200  # the dashboard's own pages
        async with http.get(srv.url + "/ui/api/tasks", headers={"Origin": "http://127.0.0.1:1"}) as r:
            assert r.status == 403
        async with http.get(srv.url + "/v1/tools") as r:
            assert r.status == 401  # the cookie opens the dashboard only, never the tools


async def test_tool_calls_and_running_jobs(tool_server: Any, tmp_path: Path) -> None:
    srv = await tool_server(SHELL, workspace=tmp_path)
    ok = await srv.rest("exec_command", {"cmd": "sleep 30", "yield_time_ms": 250}, task="t", agent="/root/worker")
    assert ok.ok, ok.body
    bad = await srv.rest("exec_command", {"cmd": "true", "tty": True}, task="t", agent="/root")
    assert not bad.ok
    async with aiohttp.ClientSession() as http, http.get(srv.url + "/ui/api/tools", headers=srv.headers()) as r:
        data = await r.json()
    calls = data["calls"]
    assert [(c["name"], c["transport"], c["outcome"]) for c in calls] == [
        ("exec_command", "rest", "ok"), ("exec_command", "rest", "error")]
    assert "PTY" in calls[1]["error"] and calls[0]["error"] is None
    assert "sleep" not in str(calls)  # no arguments
    running = [j for j in data["running"] if j["kind"] == "shell"]
    assert len(running) == 1 and running[0]["id"] == str(ok.details["session_id"])
    assert running[0]["agent"] == "/root/worker" and "sleep" not in str(running)


async def test_an_open_dashboard_does_not_hold_the_server_stop(tool_server: Any) -> None:
    import asyncio

    srv = await tool_server()
    async with aiohttp.ClientSession() as http:
        resp = await http.get(srv.url + "/ui/api/events", headers=srv.headers())
        assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
        assert await resp.content.readline() == b": connected\n"
        # Without the on_shutdown hook aiohttp waits 60 s for the stream's handler; the bound is generous.
        await asyncio.wait_for(srv.close(), 30)
        assert (await asyncio.wait_for(resp.content.read(), 30)).strip() == b""  # the stream ended (EOF)
        resp.release()


def test_plot_reads_the_journals_windows_as_they_are(tmp_path: Path) -> None:
    """A window of a strategy nobody has written yet still becomes a marker; the context lines follow config."""
    from proxy.app.sessionview import session_plot
    from proxy.config import Config
    from proxy.db import connect

    conn = connect(tmp_path / "ctproxy.db")
    for i, (strategy, at) in enumerate([("start", 1.0), ("notes", 5.0), ("some_future_strategy", 9.0)]):
        conn.execute("INSERT INTO journal_windows(task_id, address, window_id, ordinal, session_key, boundary_item_id,"
                     " strategy, bootstrap, created_at) VALUES ('t', '/root', ?, ?, 's', NULL, ?, '{}', ?)",
                     (f"w{i + 1}", i + 1, strategy, at))
    for i in range(4):
        conn.execute("INSERT INTO journal_responses(response_id, session_key, model, status, usage, item_count,"
                     " created_at) VALUES (?, 's', 'gpt-5', 'completed', ?, 1, ?)",
                     (f"r{i}", f'{{"input_tokens": {1000 * (i + 1)}, "output_tokens": 3}}', 2.0 * i + 1.5))
    conn.execute("INSERT INTO journal_responses(response_id, session_key, model, status, usage, item_count,"
                 " created_at) VALUES ('r_nousage', 's', 'gpt-5', 'failed', NULL, 0, 20.0)")
    plot = session_plot(conn, "s", Config())
    assert [p.input_tokens for p in plot.points] == [1000, 2000, 3000, 4000]  # one per answer with usage
    assert [(m.kind, m.label) for m in plot.markers] == [("window", "w2 notes"),
                                                         ("window", "w3 some_future_strategy")]
    assert plot.window == 272_000
    lines = {line.label: line.tokens for line in plot.lines}
    assert lines["reminder"] == int(272_000 * 0.7) and lines["hard trigger"] == int(272_000 * 0.85)


async def test_ctproxy_dashboard_prints_a_fresh_link(proxy_factory, tmp_path: Path) -> None:
    import asyncio
    import subprocess
    import sys

    from tests.support.proxyproc import REPO

    proxy = await proxy_factory(upstream="http://127.0.0.1:9")
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy.app.cli", "dashboard", "--state-dir",
                                                   str(proxy.state_dir)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0, out.stderr
    link = out.stdout.strip()
    assert link.startswith(proxy.tools_url + "/ui/login?code=") and link not in proxy.log()
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http, http.get(link) as r:
        assert r.status == 200 and str(r.url) == proxy.tools_url + "/ui/"
    await proxy.astop()
    out = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "proxy.app.cli", "dashboard", "--state-dir",
                                                   str(proxy.state_dir)], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 1 and "ctproxy up" in out.stderr
