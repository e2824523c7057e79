"""The one debug switch (seed 004 §8): categories, counts, ids, hosts, timings only.

The end-to-end test drives every path of the pipeline with debug on, then greps everything the
process wrote (stdout, stderr, log records) for the credentials and texts it used."""

from __future__ import annotations

import io
import logging

import aiohttp
import orjson
import pytest
from openai import AsyncOpenAI

from proxy import debuglog
from proxy.db import connect
from proxy.windows.remote import store
from tests.emulator import Emulator, FailedInStream, HttpError, Text, context_length_exceeded_400
from tests.proxy.windows.test_compaction_harness import (
    ACCOUNT,
    API_KEY,
    JWT_SECRET_PART,
    assistant,
    codex_token,
    codex_turn,
    running_proxy,
    user,
)


@pytest.fixture
def debug_stream():
    buf = io.StringIO()
    debuglog.set_enabled(True, stream=buf)
    yield buf
    debuglog.set_enabled(False)
    debuglog.reset_stream()


def test_off_by_default_writes_nothing():
    buf = io.StringIO()
    debuglog.set_enabled(False, stream=buf)
    debuglog.event("web_search", outcome="injected")
    assert buf.getvalue() == ""
    debuglog.reset_stream()


def test_only_allowed_keys_and_token_values(debug_stream):
    debuglog.event("remote_compaction", outcome="remote", host="api.openai.com", ms=12.3456, count=3,
                   prompt="secret prompt text", authorization="Bearer sk-x", reason="two words",
                   model="gpt-5.1-codex", checkpoint="cp_1234", types="message:2,function_call:1")
    line = debug_stream.getvalue()
    assert line.startswith("ctproxy-debug feature=remote_compaction ")
    assert "host=api.openai.com" in line and "ms=12.35" in line and "count=3" in line
    assert "model=gpt-5.1-codex" in line and "types=message:2,function_call:1" in line
    assert "secret" not in line and "sk-x" not in line and "prompt" not in line and "authorization" not in line
    assert "reason=?" in line  # free text is replaced, never printed


def test_item_types_counts_without_content():
    items = [{"role": "user", "content": "hi"}, {"type": "function_call", "arguments": "{\"pw\":1}"},
             {"type": "function_call"}, {"type": "has spaces"}]
    assert debuglog.item_types(items) == "function_call:2,message:1,other:1"


def test_timed_adds_ms(debug_stream):
    with debuglog.timed("web_search", outcome="x") as fields:
        fields["status"] = 200
    assert "status=200" in debug_stream.getvalue() and "ms=" in debug_stream.getvalue()


WINDOW = 20_000
CONFIG = {"debug": True, "remote_compaction": {"enabled": True},
          "model_windows": {"gpt-test*": WINDOW, "*": 128_000}}
TEXT = "turn-text-never-logged-" + "q" * 5_800


@pytest.mark.timeout(240)
async def test_every_pipeline_path_with_debug_on_logs_no_secrets_or_texts(tmp_path, monkeypatch, capfd, caplog,
                                                                         request):
    caplog.set_level(logging.DEBUG)
    ours_logger = logging.getLogger("ctproxy")  # it does not propagate while ctproxy up runs: listen to it
    ours_logger.addHandler(caplog.handler)
    request.addfinalizer(lambda: ours_logger.removeHandler(caplog.handler))
    debuglog.reset_stream()  # the real stderr
    secrets = [API_KEY, JWT_SECRET_PART, codex_token(), ACCOUNT, "turn-text-never-logged", "You said",
               "final-ask-never-logged", "ctproxy-compaction-fallback", "[ctproxy-compaction:v1:", "qqqqqqqqqq"]
    async with Emulator() as emu, running_proxy(tmp_path, emu.url, CONFIG, monkeypatch, debug=True) as base, \
            aiohttp.ClientSession() as http:
        # 1. threshold → remote compaction, replay, then a model switch → readable fallback
        history = []
        for i in range(13):
            history.append(user(f"{i} {TEXT}"))
            status, _ = await codex_turn(http, base, {"model": "gpt-test-1", "input": list(history)}, "A")
            assert status == 200
            history.append(assistant(f"answer {i}"))
        await codex_turn(http, base, {"model": "gpt-test-2", "input": [*history, user("switch")]}, "A")
        # 2. the client's history diverged from the compacted items
        edited = [user("0 edited " + TEXT), *history[1:]]
        await codex_turn(http, base, {"model": "gpt-test-1", "input": edited}, "A")
        # 3. a failing remote compaction → fallback
        emu.script_compaction(HttpError(500))
        history_b = []
        for i in range(12):
            history_b.append(user(f"b{i} {TEXT}"))
            await codex_turn(http, base, {"model": "gpt-test-1", "input": list(history_b)}, "B")
            history_b.append(assistant("ok"))
        # 4. overflow 400 recovered (API route, SDK), web search injected
        client = AsyncOpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        emu.script(context_length_exceeded_400())
        # (with older history: the retry must be strictly smaller than what failed)
        await client.responses.create(model="gpt-test-1", input=[user("older " + TEXT),
                                                                 user("final-ask-never-logged")])
        # 5. web search skipped above 128k
        emu.script(Text("big", usage={"input_tokens": 130_000}))
        long_session = [user("long-session " + TEXT)]
        await client.responses.create(model="gpt-5", input=long_session)
        await client.responses.create(model="gpt-5", input=[*long_session, assistant("big"), user("more")])
        await client.close()
        # 6. in-stream overflow in a held stream, recovered; 7. a small stream's overflow, missed
        emu.script(FailedInStream())
        big = [user(f"held {i} " + "q" * 8_000) for i in range(9)]
        held = {"model": "gpt-test-1", "input": [*big, user("final-ask-never-logged")]}
        status, _ = await codex_turn(http, base, held, "C")
        assert status == 200
        emu.script(FailedInStream())
        await codex_turn(http, base, {"model": "gpt-test-1", "input": [user("small")]}, "D")

        blobs = {i["encrypted_content"] for r in emu.requests if isinstance(r.json, dict)
                 for i in (r.json.get("input") or []) if isinstance(i, dict) and i.get("encrypted_content")}
        assert blobs
        secrets += sorted(blobs)
        conn = connect(tmp_path / "state" / "ctproxy.db")
        secrets += [cp.fallback_text[:80] for cp in _all_checkpoints(conn)]
        conn.close()

    out, err = capfd.readouterr()
    ours = [r for r in caplog.records if r.name.split(".")[0] in ("ctproxy", "mitmproxy", "proxy", "addons")]
    assert ours  # mitmproxy's own log lines are part of what is checked
    logged = out + err + "\n".join(f"{r.name} {r.getMessage()}" for r in ours)
    debug_lines = [ln for ln in logged.splitlines() if ln.startswith("ctproxy-debug ")]
    joined = "\n".join(debug_lines)
    for expected in ("feature=remote_compaction", "outcome=remote", "outcome=fallback", "reason=http_500",
                     "outcome=diverged", "feature=overflow_recovery", "outcome=recovered", "outcome=missed",
                     "feature=web_search", "outcome=injected", "reason=input_tokens", "host=127.0.0.1"):
        assert expected in joined, f"no debug line with {expected}"
    for secret in secrets:
        assert secret not in logged, f"the log holds {secret[:30]!r}"
    assert orjson.dumps(CONFIG)  # the config itself held no secret either


def _all_checkpoints(conn):
    keys = store.sessions_with_checkpoints(conn)
    return [cp for k in keys for cp in store.checkpoints(conn, k)]


def test_an_embedded_up_leaves_logging_as_it_found_it():
    """`configure_logging` takes ctproxy's loggers over while `ctproxy up` runs; `restore_logging` (called by
    run_up on its way out) hands them back, so a host process (or the next test) still sees their records."""
    ours, mitm = logging.getLogger("ctproxy"), logging.getLogger("mitmproxy")
    before = (ours.propagate, ours.level, mitm.level, list(ours.handlers), list(mitm.handlers))
    debuglog.configure_logging(debug=True, request_log=True)
    assert ours.propagate is False and ours.level == logging.DEBUG
    debuglog.restore_logging()
    assert (ours.propagate, ours.level, mitm.level, list(ours.handlers), list(mitm.handlers)) == before
