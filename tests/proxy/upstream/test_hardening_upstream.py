"""Upstream timeouts and the proxy's own errors, end to end through `ctproxy up` (issue 10, points 4 and 5).

Timeouts are configured short (0.5 s); every wait is for a condition, with a generous bound, and no test
asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import openai
import orjson
import pytest

from tests.emulator import Text
from tests.support.ports import closed_port

WAIT = 30.0  # the bound of every wait: far above any timeout configured here


def _config(tmp_path: Path, name: str, **sections: dict) -> Path:
    state = tmp_path / name
    state.mkdir()
    (state / "config.json").write_text(json.dumps(sections))
    return state


def _client(proxy, **kw) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key="sk-test", max_retries=0, timeout=WAIT, **kw)


async def _until(predicate, what: str) -> None:
    async with asyncio.timeout(WAIT):
        while not predicate():
            await asyncio.sleep(0.02)
    assert predicate(), what


def _json_error(exc: openai.APIStatusError) -> dict:
    assert exc.response.headers["content-type"].startswith("application/json")
    body = orjson.loads(exc.response.content)
    assert set(body) == {"error"} and {"message", "type", "code", "param"} <= set(body["error"])
    return body["error"]


# ---- point 5: the proxy's own errors are JSON --------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_unreachable_upstream_gives_the_sdk_a_json_error(tmp_path, proxy_factory, stream):
    with closed_port() as port, pytest.raises(openai.APIStatusError) as info:  # nothing listens there
        proxy = await proxy_factory(upstream=f"http://127.0.0.1:{port}")
        await _client(proxy).responses.create(model="gpt-5", input="hi", stream=stream)
    exc = info.value
    assert exc.status_code == 502
    err = _json_error(exc)
    assert err["code"] == "upstream_unreachable" and err["type"] == "server_error"
    assert "connection refused" in err["message"]
    # The SDK's own message is the JSON error's message (not "Error code: 502" alone); no address leaks.
    assert str(exc) == f"Error code: 502 - {err['message']}" and "<html" not in exc.response.text.lower()
    assert str(port) not in exc.response.text and "127.0.0.1" not in exc.response.text
    assert exc.response.headers["x-ctproxy-error"] == "upstream_unreachable"


async def test_upstream_closing_before_it_answers_gives_a_json_502(proxy_factory):
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request's head, then close without a word
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        proxy = await proxy_factory(upstream=f"http://127.0.0.1:{port}")
        with pytest.raises(openai.APIStatusError) as info:
            await _client(proxy).responses.create(model="gpt-5", input="hi")
    finally:
        server.close()
    assert info.value.status_code == 502
    assert _json_error(info.value)["code"] == "upstream_disconnected"


async def test_a_request_mitmproxy_cannot_parse_gets_a_json_400(proxy_factory, emulator):
    proxy = await proxy_factory(upstream=emulator.url)
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    writer.write(b"NOT AN HTTP REQUEST\r\n\r\n")
    await writer.drain()
    async with asyncio.timeout(WAIT):
        raw = await reader.read()
    writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"content-type: application/json" in head.lower()
    assert orjson.loads(body)["error"]["type"] == "invalid_request_error"
    assert emulator.requests == []


# ---- point 4: connect timeout ------------------------------------------------------------------------

@pytest.fixture
def blackhole() -> Iterator[int]:
    """A port whose accept queue is full: a connection attempt to it hangs in SYN-SENT (the kernel drops
    the SYN), as with an upstream behind a dead route."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(8):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    yield port
    for c in fillers:
        c.close()
    srv.close()


@pytest.fixture
def mute_tls() -> Iterator[int]:
    """A port that accepts connections and never says a word: a TLS handshake to it hangs."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    yield srv.getsockname()[1]
    srv.close()


async def test_connect_timeout_gives_a_504_json_error(tmp_path, proxy_factory, blackhole):
    state = _config(tmp_path, "s", timeouts={"connect_seconds": 0.5})
    proxy = await proxy_factory(upstream=f"http://127.0.0.1:{blackhole}", state_dir=state)
    with pytest.raises(openai.APIStatusError) as info:
        await _client(proxy).responses.create(model="gpt-5", input="hi")
    assert info.value.status_code == 504
    err = _json_error(info.value)
    assert err["code"] == "upstream_connect_timeout"
    assert str(blackhole) not in info.value.response.text
    # The proxy keeps working for the next request (a fresh attempt, answered the same way).
    with pytest.raises(openai.APIStatusError) as again:
        await _client(proxy).responses.create(model="gpt-5", input="again")
    assert again.value.status_code == 504


# ---- point 4: idle timeout ---------------------------------------------------------------------------

@pytest.mark.parametrize("stream", [False, True])
async def test_silent_upstream_before_headers_gives_a_504_and_is_closed(tmp_path, proxy_factory, emulator, stream):
    state = _config(tmp_path, "s", timeouts={"stream_idle_seconds": 0.5})
    proxy = await proxy_factory(upstream=emulator.url, state_dir=state)
    emulator.script(Text("never sent", stall_before_headers=True))
    with pytest.raises(openai.APIStatusError) as info:
        await _client(proxy).responses.create(model="gpt-5", input="hi", stream=stream)
    assert info.value.status_code == 504
    err = _json_error(info.value)
    assert err["code"] == "upstream_idle_timeout"
    assert "sent no answer" in err["message"]
    rec = emulator.responses_requests[0]
    await _until(lambda: rec.client_disconnected, "the proxy closed the upstream connection")


@pytest.mark.parametrize("features", ["default", "all_off"])
async def test_stream_that_goes_silent_ends_with_an_error_event(tmp_path, proxy_factory, emulator, features):
    state = _config(tmp_path, "s", timeouts={"stream_idle_seconds": 0.5})
    extra = ["--disable", "all"] if features == "all_off" else []  # all off: no tap counts the events
    proxy = await proxy_factory(upstream=emulator.url, state_dir=state, extra_args=extra)
    emulator.script(Text("hello there, world", deltas=6, stall_after=4))
    events = []
    stream = await _client(proxy).responses.create(model="gpt-5", input="hi", stream=True)
    async with asyncio.timeout(WAIT):
        async for ev in stream:
            events.append(ev)
    assert [e.type for e in events[:4]] == ["response.created", "response.in_progress",
                                            "response.output_item.added", "response.content_part.added"]
    last = events[-1]
    assert len(events) == 5 and last.type == "error"
    assert last.code == "upstream_idle_timeout" and "sent nothing more" in last.message
    assert last.sequence_number == events[-2].sequence_number + 1
    rec = emulator.responses_requests[0]
    await _until(lambda: rec.client_disconnected, "the proxy closed the upstream connection")
    # The client connection stays usable: the next turn goes through.
    emulator.script(Text("fine again"))
    resp = await _client(proxy).responses.create(model="gpt-5", input="next")
    assert resp.output_text == "fine again"


async def test_a_slow_stream_that_keeps_talking_is_not_cut(tmp_path, proxy_factory, emulator):
    # Each gap is well below the idle timeout; together they are far above it: only silence counts.
    state = _config(tmp_path, "s", timeouts={"stream_idle_seconds": 2.0})
    proxy = await proxy_factory(upstream=emulator.url, state_dir=state)
    emulator.script(Text("slow but steady", deltas=8, delays={i: 0.4 for i in range(2, 11)}))
    stream = await _client(proxy).responses.create(model="gpt-5", input="hi", stream=True)
    types = []
    async with asyncio.timeout(WAIT * 2):
        async for ev in stream:
            types.append(ev.type)
    assert types[-1] == "response.completed" and "error" not in types


async def test_a_hanging_tls_handshake_counts_as_connect_time(tmp_path, proxy_factory, mute_tls):
    state = _config(tmp_path, "s", timeouts={"connect_seconds": 0.5})
    proxy = await proxy_factory(upstream=f"https://127.0.0.1:{mute_tls}", state_dir=state)
    with pytest.raises(openai.APIStatusError) as info:
        await _client(proxy).responses.create(model="gpt-5", input="hi")
    assert info.value.status_code == 504
    assert _json_error(info.value)["code"] == "upstream_connect_timeout"
