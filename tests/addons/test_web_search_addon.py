"""The web search addon on flows: per route kind and config, the 128k skip, standalone use."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from mitmproxy.test import taddons, tflow, tutils

from addons.web_search import WebSearch
from proxy import usage
from proxy.app import runtime
from proxy.db import connect
from proxy.host.flowstate import state_of
from proxy.routes import Route
from proxy.session import resolve_session
from proxy.transforms.web_search import SOURCES_INCLUDE

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def rt(tmp_path):
    def make(**overrides):
        built = runtime.build(state_dir=str(tmp_path / "state"))
        overrides = {"web_search.enabled": True, **overrides}  # turned on explicitly, whatever the default
        for key, value in overrides.items():
            section, _, name = key.partition(".")
            setattr(getattr(built.config, section), name, value)
        runtime.install(built)
        return built

    yield make
    runtime.uninstall()


def make_flow(host="api.openai.com", path="/v1/responses", scheme="https", port=443, body=None, headers=()):
    payload = body if body is not None else {"model": "gpt-5", "input": "hello"}
    req = tutils.treq(method=b"POST", scheme=scheme.encode(), host=host, port=port, path=path.encode(),
                      content=orjson.dumps(payload),
                      headers=((b"content-type", b"application/json"), *headers))
    return tflow.tflow(req=req)


def sent(flow):
    return orjson.loads(flow.request.content)


async def run(addon, flow):
    with taddons.context(addon):
        await addon.request(flow)


@pytest.mark.parametrize(("host", "path"), [("api.openai.com", "/v1/responses"),
                                            ("chatgpt.com", "/backend-api/codex/responses")])
async def test_injects_on_official_routes(rt, host, path):
    rt()
    flow = make_flow(host, path)
    await run(WebSearch(), flow)
    body = sent(flow)
    assert body["tools"] == [{"type": "web_search"}]
    assert body["include"] == [SOURCES_INCLUDE]
    assert state_of(flow).web_search == "native"


@pytest.mark.parametrize(("host", "path", "scheme", "port"), [
    ("example.com", "/v1/responses", "https", 443),  # a gateway
    ("api.openai.com.evil.test", "/v1/responses", "https", 443),  # look-alike
    ("api.openai.com", "/v1/responses", "http", 80),  # not https
    ("api.openai.com", "/v2/responses", "https", 443),  # not an API path
])
async def test_never_touches_other_routes(rt, host, path, scheme, port):
    rt()
    flow = make_flow(host, path, scheme, port)
    before = flow.request.raw_content
    await run(WebSearch(), flow)
    assert flow.request.raw_content == before


async def test_trusted_route_from_routing_is_eligible(rt):
    rt()
    flow = make_flow("127.0.0.1", "/v1/responses", "http", 8080)
    state_of(flow).route = Route(kind="api", official=False, trusted=True)
    await run(WebSearch(), flow)
    assert sent(flow)["tools"] == [{"type": "web_search"}]


@pytest.mark.parametrize(("key", "value"), [("web_search.backend", "off"), ("web_search.backend", "sidecar"),
                                            ("web_search.enabled", False)])
async def test_config_turns_it_off(rt, key, value):
    rt(**{key: value})
    flow = make_flow()
    before = flow.request.raw_content
    await run(WebSearch(), flow)
    assert flow.request.raw_content == before


async def test_cached_mode_and_context_size(rt):
    rt(**{"web_search.mode": "cached", "web_search.context_size": "high"})
    flow = make_flow()
    await run(WebSearch(), flow)
    assert sent(flow)["tools"] == [{"type": "web_search", "external_web_access": False,
                                    "search_context_size": "high"}]


async def test_skips_above_128k_and_records_why(rt):
    built = rt()
    payload = {"model": "gpt-5", "input": [{"role": "user", "content": "long session"}]}
    ident = resolve_session({}, payload)
    conn = connect(built.state.db_path)
    usage.record_usage(conn, ident.session_key, None, None, "gpt-5", {"input_tokens": 130_000, "output_tokens": 5},
                       "resp_1")
    conn.close()
    flow = make_flow(body=payload)
    before = flow.request.raw_content
    await run(WebSearch(), flow)
    assert flow.request.raw_content == before
    assert state_of(flow).web_search == "input_tokens"
    # another session is unaffected
    other = make_flow(body={"model": "gpt-5", "input": "fresh"})
    await run(WebSearch(), other)
    assert sent(other)["tools"] == [{"type": "web_search"}]


async def test_non_json_and_other_endpoints_untouched(rt):
    rt()
    flow = make_flow(path="/v1/responses/compact")
    before = flow.request.raw_content
    await run(WebSearch(), flow)
    assert flow.request.raw_content == before
    req = tutils.treq(method=b"POST", scheme=b"https", host="api.openai.com", port=443, path=b"/v1/responses",
                      content=b"not json", headers=((b"content-type", b"application/json"),))
    bad = tflow.tflow(req=req)
    await run(WebSearch(), bad)
    assert bad.request.raw_content == b"not json"


async def test_keeps_content_encoding(rt):
    rt()
    flow = make_flow(headers=((b"content-encoding", b"gzip"),))
    flow.request.content = orjson.dumps({"model": "gpt-5", "input": "zipped"})  # encodes as gzip
    assert flow.request.raw_content[:2] == b"\x1f\x8b"
    await run(WebSearch(), flow)
    assert flow.request.raw_content[:2] == b"\x1f\x8b"
    assert sent(flow)["tools"] == [{"type": "web_search"}]


# ---- `mitmdump -s addons/web_search.py` against a recording upstream ---------------------------


async def _wait_port(proc: subprocess.Popen) -> int:
    """The port mitmdump bound (it was started on port 0), read from its own listening socket."""
    from tests.support.ports import listening_port

    try:
        return await asyncio.to_thread(listening_port, proc, what="mitmdump")
    except RuntimeError as e:
        err = proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ""
        raise AssertionError(f"{e}: {err}") from None


@pytest.mark.timeout(120)
async def test_mitmdump_loads_it_alone(tmp_path):
    from openai import AsyncOpenAI

    from tests.emulator import Emulator

    mitmdump = shutil.which("mitmdump", path=str(Path(sys.executable).parent))
    assert mitmdump, "mitmdump is installed with mitmproxy"
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "config.json").write_text('{"web_search": {"enabled": true}}')
    async with Emulator() as emu:
        env = {**os.environ, "CTPROXY_HOME": str(tmp_path / "state"), "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [mitmdump, "-q", "--mode", f"reverse:{emu.url}", "--listen-host", "127.0.0.1", "--listen-port",
             "0", "-s", str(REPO / "addons" / "web_search.py"), "--set", "ctp_trust_upstream=true",
             "--set", f"confdir={tmp_path / 'mitm'}"],
            cwd=str(REPO), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            port = await _wait_port(proc)
            client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-test-standalone", max_retries=0)
            answer = await client.responses.create(model="gpt-5", input="search please")
            assert answer.output_text.startswith("You said")
            await client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        body = emu.responses_requests[-1].json
        assert body["tools"] == [{"type": "web_search"}]
        assert SOURCES_INCLUDE in body["include"]


# ---- `ctproxy replay` of a recorded flow shows the injection ------------------------------------


def test_replay_of_recorded_flow_shows_injection(capsys, tmp_path):
    from proxy.app import cli

    flows = REPO / "tests" / "flows" / "web_search_sdk.mitm"
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "config.json").write_text('{"web_search": {"enabled": true}}')
    code = cli.main(["replay", str(flows), "--state-dir", str(tmp_path / "state")])
    out = capsys.readouterr().out
    assert code == 0
    assert "--- WebSearch: body" in out
    assert '+      "type": "web_search"' in out
    assert f'+    "{SOURCES_INCLUDE}"' in out
    assert "sk-recorded" not in out  # credentials are never printed


def _claimed_start(payload: dict) -> dict[str, str]:
    """Response aliases in which an earlier conversation claimed `payload`'s start: a first turn under it opens
    a session of its own, minted from its flow's id."""
    from proxy.session import CLAIM_PREFIX

    start = resolve_session({}, payload).session_key
    return {CLAIM_PREFIX + start: start}


def test_a_minted_key_is_recognised_only_for_the_request_that_minted_it():
    from proxy.session import minted_for

    payload = {"model": "gpt-5", "input": "hello again"}
    aliases = _claimed_start(payload)
    minted = resolve_session({}, payload, aliases, fresh="flow-1").session_key
    assert minted_for(minted, "flow-1")
    assert not minted_for(minted, "flow-2")  # a later request that reaches it (its next turn) did not mint it
    assert not minted_for(resolve_session({}, payload, aliases).session_key, "flow-1")  # no fresh value: the start
    assert not minted_for(resolve_session({}, payload, {}, fresh="flow-1").session_key, "flow-1")  # unclaimed start


def _count_database_reads(monkeypatch) -> list[object]:
    """Every job handed to a database thread from now on, in order (the round trips a request makes)."""
    from proxy.dbworker import DBWorker

    reads: list[object] = []
    real_run = DBWorker.run

    def counting(self, fn):
        reads.append(fn)
        return real_run(self, fn)

    monkeypatch.setattr(DBWorker, "run", counting)
    return reads


async def test_no_database_read_for_a_session_this_request_opens_or_one_compaction_read(rt, monkeypatch):
    built = rt()
    reads = _count_database_reads(monkeypatch)
    payload = {"model": "gpt-5", "input": "hello again"}
    built.services.response_aliases = _claimed_start(payload)
    flow = make_flow(body=payload)
    await run(WebSearch(), flow)
    assert sent(flow)["tools"] == [{"type": "web_search"}]
    assert reads == []  # a minted session: nothing was recorded for it, so nothing is read

    # Another session this process has no usage for, whose usage compaction read for this request already: it is
    # taken from the flow, not read again (130k tokens in it: the 128k skip applies, with no row in the database).
    other = make_flow(body={"model": "gpt-5", "input": "a long one"})
    other_key = resolve_session({}, {"model": "gpt-5", "input": "a long one"}).session_key
    state_of(other).stored_usage = {other_key: usage.make_usage("k", None, None, "gpt-5", {"input_tokens": 130_000},
                                                               "resp_1")}
    await run(WebSearch(), other)
    assert reads == []
    assert state_of(other).web_search == "input_tokens"

    # Neither: the database is read, as before.
    third = make_flow(body={"model": "gpt-5", "input": "a third one"})
    await run(WebSearch(), third)
    assert len(reads) == 1


async def test_the_usage_compaction_read_for_the_request_is_the_one_web_search_uses(rt, monkeypatch):
    from addons.compaction import Compaction
    from addons.history import History
    from addons.session import Session
    from addons.tap import Tap

    built = rt()
    payload = {"model": "gpt-5", "input": [{"role": "user", "content": "a session another process served"}]}
    ident = resolve_session({}, payload)
    conn = connect(built.state.db_path)
    usage.record_usage(conn, ident.session_key, None, None, "gpt-5", {"input_tokens": 130_000, "output_tokens": 5},
                       "resp_1")  # its last answer, recorded elsewhere: not in this process's memo
    conn.close()
    reads = _count_database_reads(monkeypatch)
    chain = [Session(), Tap(), History(), Compaction(), WebSearch()]
    with taddons.context(*chain):
        flow = make_flow(body=payload)
        for stage in chain[:-1]:
            if hasattr(stage, "request") and (pending := stage.request(flow)) is not None:
                await pending
        read = (state_of(flow).stored_usage or {}).get(ident.session_key)
        assert read is not None and read.input_tokens == 130_000  # compaction read the session's usage
        before = len(reads)
        await chain[-1].request(flow)
        assert len(reads) == before  # web search took it from the flow: no second round trip
        assert state_of(flow).web_search == "input_tokens"  # and decided on it (the 128k skip)
        if built.services.journal is not None:
            built.services.journal.flush()
