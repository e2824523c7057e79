"""Remote compaction pieces: estimate and boundary, fingerprints, request bodies, result parsing, the
clients against the emulator, and one engine run per outcome."""

from __future__ import annotations

import base64
import dataclasses
from contextlib import asynccontextmanager

import orjson
import pytest

from proxy.db import connect
from proxy.items.canonical import chain_at, session_root
from proxy.journal import Journal
from proxy.state import StateDir
from proxy.upstream import UpstreamTurns
from proxy.windows.fallback import is_fallback_message
from proxy.windows.remote import protocol
from proxy.windows.remote.decision import LastRequest, UsageSnapshot, calibration, choose_boundary, estimate, over
from proxy.windows.remote.engine import Plan, compact, http_caller
from proxy.windows.remote.fingerprint import (
    Fingerprint,
    account_hash,
    auth_identity,
    compatible,
    fingerprint_of,
    load_key,
    normalise_endpoint,
)
from proxy.windows.remote.journal_link import WindowSession, open_window
from proxy.windows.remote.remote import compaction_target, run_compaction
from proxy.windows.remote.store import (
    checkpoints,
    events,
    latest_checkpoint,
    mark_force_compact,
    record_event,
    record_forwarded,
    session_state,
)
from tests.emulator import Compaction, Emulator, FailedInStream, HttpError, Raw, Response, Text
from tests.openapi_schema import validate_if_available


def user(text):
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def assistant(text):
    return {"type": "message", "role": "assistant", "content": text}


# ---- estimate and boundary -----------------------------------------------------------------------


def test_estimate_without_usage_is_bytes_over_four():
    items = [user("x" * 4000)]
    est = estimate(8000, items, None, None, None)
    assert (est.tokens, est.method, est.ratio) == (2000, "bytes", 1.0)


def test_estimate_uses_last_usage_plus_new_items_calibrated():
    items = [user("a" * 400), assistant("b" * 400), user("c" * 4000)]
    last = LastRequest(None, 2, 4000)  # 1000 byte-tokens were sent last time
    usage = UsageSnapshot(2000, 100)  # … and upstream counted 2000: this session has 2 tokens per byte-token
    est = estimate(99_999, items, None, usage, last)
    new_tokens = (len(orjson.dumps(items[2:])) + 3) // 4
    assert est.method == "usage"
    assert est.ratio == 2.0
    assert est.tokens == 2000 + 100 + 2 * new_tokens


def test_estimate_falls_back_to_bytes_when_the_window_changed():
    items = [user("a")]
    est = estimate(4000, items, "cp_new", UsageSnapshot(500_000, 10), LastRequest("cp_old", 1, 4000))
    assert est.method == "bytes"
    assert est.tokens == pytest.approx(1000 * calibration(UsageSnapshot(500_000, 10), LastRequest("cp_old", 1, 4000)))


def test_calibration_is_clamped():
    assert calibration(UsageSnapshot(10**9, 0), LastRequest(None, 1, 4)) == 4.0
    assert calibration(UsageSnapshot(1, 0), LastRequest(None, 1, 4_000_000)) == 0.25
    assert calibration(None, None) == 1.0


def test_over():
    assert over(81, 100, 0.8) and not over(80, 100, 0.8)
    assert not over(10**9, None, 0.8)


def test_boundary_keeps_small_tail_from_newest_real_user_message():
    items = [user("q1"), assistant("a1"), user("<environment_context>x</environment_context>"), user("q2"),
             {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}]
    assert choose_boundary(items, 0, 100_000) == 3
    assert choose_boundary(items, 3, 100_000) == 5  # nothing new before the tail: compact everything
    big_tail = [user("q1"), assistant("a1"), user("q2"), {"type": "function_call_output", "call_id": "c",
                                                          "output": "z" * 200_000}]
    assert choose_boundary(big_tail, 0, 100_000) == 4  # the tail alone would be a quarter of the window
    assert choose_boundary([user("only")], 0, 100_000) == 1


# ---- fingerprints --------------------------------------------------------------------------------


def jwt(claims):
    enc = base64.urlsafe_b64encode(orjson.dumps(claims)).rstrip(b"=").decode()
    return f"eyJhbGciOiJub25lIn0.{enc}.sig"


def test_auth_identity_kinds():
    assert auth_identity({})[0] == "none"
    kind, ident = auth_identity({"Authorization": "Bearer sk-proj-abc"})
    assert kind == "api_key" and "sk-proj-abc" in ident
    kind, ident = auth_identity({"authorization": "Bearer " + jwt({"sub": "u"}), "chatgpt-account-id": "acct_1"})
    assert (kind, ident) == ("oauth", "account\x00acct_1")
    claims = {"https://api.openai.com/auth": {"chatgpt_account_id": "acct_2"}}
    assert auth_identity({"authorization": "Bearer " + jwt(claims)}) == ("oauth", "account\x00acct_2")
    assert auth_identity({"authorization": "Bearer opaque-token"})[0] == "bearer"


def test_oauth_token_refresh_keeps_the_same_account_hash(tmp_path):
    key = load_key(tmp_path)
    a = fingerprint_of("codex", "gpt-5", "https://chatgpt.com/backend-api/codex",
                       {"authorization": "Bearer " + jwt({"sub": "1"}), "chatgpt-account-id": "acct"}, key)
    b = fingerprint_of("codex", "gpt-5", "https://chatgpt.com/backend-api/codex",
                       {"authorization": "Bearer " + jwt({"sub": "2"}), "chatgpt-account-id": "acct"}, key)
    assert a == b and compatible(a, b)
    assert "acct" not in a.account_hash and len(a.account_hash) == 64


def test_key_is_private_and_stable(tmp_path):
    k1 = load_key(tmp_path)
    assert load_key(tmp_path) == k1
    assert (tmp_path / "compaction-account.key").stat().st_mode & 0o777 == 0o600
    assert account_hash(k1, "x") != account_hash(b"another key" * 3, "x")


@pytest.mark.parametrize("field", ["provider_kind", "model", "endpoint", "auth_kind", "account_hash"])
def test_any_fingerprint_difference_blocks_replay(field):
    base = Fingerprint("codex", "gpt-5", "https://chatgpt.com/backend-api/codex", "oauth", "ab" * 32)
    other = Fingerprint(**{**base.__dict__, field: base.__dict__[field] + "x"})
    assert compatible(base, base)
    assert not compatible(base, other)


def test_unknown_auth_never_replays():
    fp = Fingerprint("api", "gpt-5", "https://api.openai.com/v1", "none", "")
    assert not compatible(fp, fp)


@pytest.mark.parametrize(("args", "expected"), [
    (("https", "API.openai.com", 443, "/v1/responses"), "https://api.openai.com/v1"),
    (("https", "chatgpt.com", 443, "/backend-api/codex/responses?x=1"), "https://chatgpt.com/backend-api/codex"),
    (("http", "127.0.0.1", 8080, "/gw/v1/responses"), "http://127.0.0.1:8080/gw/v1"),
])
def test_normalise_endpoint(args, expected):
    assert normalise_endpoint(*args) == expected


# ---- request bodies and result parsing ----------------------------------------------------------


def test_v2_body_has_one_trailing_trigger_and_streams():
    payload = {"model": "gpt-5", "instructions": "sys", "tools": [{"type": "web_search"}], "input": "ignored",
               "previous_response_id": "resp_x", "max_output_tokens": 5, "store": False,
               "include": ["reasoning.encrypted_content"], "prompt_cache_key": "t1"}
    body = protocol.v2_body(payload, [user("a")], 272_000)
    assert body["input"] == [user("a"), {"type": "compaction_trigger"}]
    assert body["stream"] is True and body["store"] is False
    assert "previous_response_id" not in body and "max_output_tokens" not in body
    assert body["tools"] == [{"type": "web_search"}] and body["prompt_cache_key"] == "t1"
    assert sum(1 for i in body["input"] if i.get("type") == "compaction_trigger") == 1


def test_v1_body_has_only_compact_fields():
    payload = {"model": "gpt-5", "instructions": "sys", "tools": [{"type": "web_search"}], "stream": True,
               "store": False, "include": ["x"], "prompt_cache_key": "k"}
    body = protocol.v1_body(payload, [user("a")], None)
    assert body == {"model": "gpt-5", "instructions": "sys", "prompt_cache_key": "k", "input": [user("a")]}


def test_trim_blanks_trailing_tool_outputs_newest_first():
    items = [user("q"), {"type": "function_call_output", "call_id": "1", "output": "a" * 4000},
             {"type": "function_call_output", "call_id": "2", "output": "b" * 4000}]
    out = protocol.trim_to_window(items, 1500)
    assert out[2]["output"] == protocol.TRUNCATED_OUTPUT
    assert out[1]["output"] == "a" * 4000  # the newest one was enough
    assert items[2]["output"] == "b" * 4000  # input untouched
    assert protocol.trim_to_window(items, 10**6) is items


def test_beta_header_merge():
    assert protocol.beta_features(None) == "remote_compaction_v2"
    assert protocol.beta_features("memories") == "memories,remote_compaction_v2"
    assert protocol.beta_features("remote_compaction_v2, memories") == "remote_compaction_v2,memories"


def _collect(events_):
    c = protocol.V2Collector()
    for ev in events_:
        if c.feed(ev):
            break
    return c


CMP = {"type": "compaction", "encrypted_content": "blob=="}
DONE = {"type": "response.completed", "response": {"id": "resp_1", "usage": {"input_tokens": 5}}}


def test_v2_collector_needs_completed_and_exactly_one_item():
    ok = _collect([{"type": "response.output_item.done", "item": {"type": "reasoning", "summary": []}},
                   {"type": "response.output_item.done", "item": CMP}, DONE]).result()
    assert ok.compaction_item == CMP and ok.output_items == 2 and ok.usage == {"input_tokens": 5}
    with pytest.raises(protocol.CompactionFailure, match="stream_incomplete"):
        _collect([{"type": "response.output_item.done", "item": CMP}]).result()
    with pytest.raises(protocol.CompactionFailure, match="compaction_count"):
        _collect([{"type": "response.output_item.done", "item": CMP},
                  {"type": "response.output_item.done", "item": CMP}, DONE]).result()
    with pytest.raises(protocol.CompactionFailure, match="compaction_count"):
        _collect([DONE]).result()
    with pytest.raises(protocol.CompactionFailure, match="upstream_context_length_exceeded"):
        _collect([{"type": "response.failed", "response": {"error": {"code": "context_length_exceeded"}}}]).result()
    with pytest.raises(protocol.CompactionFailure, match="malformed_item"):
        _collect([{"type": "response.output_item.done", "item": {"type": "compaction"}}, DONE]).result()


def test_parse_v1():
    assert protocol.parse_v1(200, {"output": [user("a"), CMP]}).compaction_item == CMP
    for status, body, category in [(500, {"error": {"code": "server_error"}}, "upstream_server_error"),
                                   (502, None, "http_502"), (200, {"nope": 1}, "malformed_response"),
                                   (200, {"output": [user("a")]}, "compaction_count")]:
        with pytest.raises(protocol.CompactionFailure, match=category):
            protocol.parse_v1(status, body)


def test_parse_v1_keeps_the_returned_items_before_the_compaction_item_as_the_bootstrap():
    kept = {"id": "msg_1", "type": "message", "status": "completed", "role": "user",
            "content": [{"type": "input_text", "text": "a"}]}
    assert protocol.parse_v1(200, {"output": [kept, CMP]}).retained == (kept,)
    assert protocol.parse_v1(200, {"output": [CMP]}).retained == ()
    with pytest.raises(protocol.CompactionFailure, match="compaction_not_last"):
        protocol.parse_v1(200, {"output": [CMP, kept]})


# ---- the clients against the emulator ------------------------------------------------------------


def test_target_sends_credentials_only_when_allowed():
    headers = {"Authorization": "Bearer sk-x", "Cookie": "c=1", "X-Other": "no", "originator": "codex_cli_rs",
               "x-codex-beta-features": "memories"}
    t = compaction_target("codex", "https", "chatgpt.com", 443, "/backend-api/codex/responses", headers, True)
    assert t.url == "https://chatgpt.com/backend-api/codex/responses"
    assert t.headers["authorization"] == "Bearer sk-x" and "cookie" not in t.headers and "x-other" not in t.headers
    assert t.headers["x-codex-beta-features"] == "memories,remote_compaction_v2"
    api = compaction_target("api", "https", "api.openai.com", 443, "/v1/responses", headers, False)
    assert api.url == "https://api.openai.com/v1/responses/compact"
    assert "authorization" not in api.headers and "x-codex-beta-features" not in api.headers
    assert compaction_target("api", "https", "api.openai.com", 443, "/v1/other", headers, True) is None



@asynccontextmanager
async def _turns():
    """The upstream-turn service over its real (aiohttp) transport, closed afterwards."""
    turns = UpstreamTurns()
    try:
        yield turns
    finally:
        await turns.close()


async def test_codex_v2_against_emulator():
    async with Emulator() as emu, _turns() as http:
        target = compaction_target("codex", "http", emu.host, emu.port, "/backend-api/codex/responses",
                                   {"authorization": "Bearer tok", "chatgpt-account-id": "acct"}, True)
        body = protocol.v2_body({"model": "gpt-5", "store": False}, [user("hello"), assistant("hi")], None)
        validate_if_available("CreateResponse", body)
        result = await run_compaction(http, target, body, 30)
        assert result.compaction_item["type"] == "compaction"
        assert orjson.loads(result.compaction_item_bytes) == result.compaction_item
        rec = emu.requests[-1]
        assert rec.route == "compaction"
        assert rec.path == "/backend-api/codex/responses"
        assert dict((k.lower(), v) for k, v in rec.headers)["x-codex-beta-features"] == "remote_compaction_v2"
        assert rec.json["input"][-1] == {"type": "compaction_trigger"}


async def test_api_compact_against_emulator():
    async with Emulator() as emu, _turns() as http:
        target = compaction_target("api", "http", emu.host, emu.port, "/v1/responses", {}, True)
        result = await run_compaction(http, target, protocol.v1_body({"model": "gpt-5"}, [user("q")], None), 30)
        assert result.compaction_item["type"] == "compaction"
        assert emu.requests[-1].path == "/v1/responses/compact"


@pytest.mark.parametrize(("script", "category"), [
    (Response([Text("no compaction here")]), "compaction_count"),
    (Response([Compaction(), Compaction()]), "compaction_count"),
    (FailedInStream(), "upstream_"),
    (HttpError(500), "http_500"),
    (Compaction(disconnect_after=2), "stream_incomplete"),
])
async def test_codex_v2_failures(script, category):
    async with Emulator() as emu, _turns() as http:
        emu.script_compaction(script)
        target = compaction_target("codex", "http", emu.host, emu.port, "/backend-api/codex/responses", {}, True)
        with pytest.raises(protocol.CompactionFailure, match=category):
            await run_compaction(http, target, protocol.v2_body({"model": "gpt-5"}, [user("q")], None), 30)


async def test_api_compact_failures():
    async with Emulator() as emu, _turns() as http:
        emu.script_compact(HttpError(502), Raw(200, {"content-type": "application/json"}, b"not json"))
        target = compaction_target("api", "http", emu.host, emu.port, "/v1/responses", {}, True)
        body = protocol.v1_body({"model": "gpt-5"}, [user("q")], None)
        with pytest.raises(protocol.CompactionFailure, match=r"http_502|upstream_"):
            await run_compaction(http, target, body, 30)
        with pytest.raises(protocol.CompactionFailure, match="malformed_response"):
            await run_compaction(http, target, body, 30)


async def test_connection_refused_is_a_category():
    async with _turns() as http:
        target = compaction_target("api", "http", "127.0.0.1", 9, "/v1/responses", {}, True)
        with pytest.raises(protocol.CompactionFailure, match="connection"):
            await run_compaction(http, target, {"model": "m", "input": []}, 5)


# ---- the engine and the store ---------------------------------------------------------------------

FP = Fingerprint("codex", "gpt-5", "http://x/backend-api/codex", "oauth", "ab" * 32)


def plan(items, target, blocked=None, previous=None, replay=False, boundary=None):
    return Plan(session_key="sess", client_items=items, previous=previous, replay_opaque=replay,
                boundary=boundary or len(items), payload={"model": "gpt-5"}, window=272_000, fingerprint=FP,
                target=target, remote_blocked=blocked, reason="threshold")


async def test_engine_remote_then_fallback_and_store_round_trip(tmp_path):
    items = [user("q1"), assistant("a1"), user("q2")]
    async with Emulator() as emu, _turns() as http:
        target = compaction_target("codex", "http", emu.host, emu.port, "/backend-api/codex/responses", {}, True)
        cp = await compact(plan(items, target), http_caller(http, 30))
        assert cp.strategy == "remote" and cp.reason == "threshold"
        assert cp.retained == (user("q1"), user("q2"))
        assert cp.boundary_hash == chain_at(items, session_root("sess"), 3)  # the one chain, the session's root
        assert is_fallback_message({"role": "user", "content": cp.fallback_text})
        more = [*items, assistant("a2"), user("q3")]
        emu.script_compaction(HttpError(500))
        cp2 = await compact(plan(more, target, previous=cp, replay=True), http_caller(http, 30))
        assert cp2.strategy == "fallback" and cp2.reason == "threshold:http_500"
        assert cp2.compaction_item is None
        assert "q3" in cp2.fallback_text and "q1" in cp2.fallback_text  # the readable side covers everything
        sent = emu.requests[-1].json["input"]
        assert sent[:3] == [user("q1"), user("q2"), orjson.loads(cp.compaction_item)]  # v2 saw the projection
        blocked = await compact(plan(items, target, blocked="custom_instructions"), http_caller(http, 30))
        assert blocked.strategy == "fallback" and blocked.reason == "threshold:custom_instructions"
        assert len(emu.requests) == 2  # a blocked compaction calls nothing
    # A checkpoint is a journal window: opened through the journal, read back as the same checkpoint.
    state = StateDir.open(tmp_path / "state")
    journal = Journal(state)
    ws = WindowSession(journal, "sess", "task_1", "/root", None, None)
    journal.session("sess", "task_1", "/root")
    saved = open_window(ws, cp)
    assert journal.window_of("sess").strategy == "remote"
    saved2 = open_window(ws, cp2)
    journal.flush()
    conn = connect(state.db_path)
    assert latest_checkpoint(conn, "sess") == saved2
    assert checkpoints(conn, "sess") == [saved, saved2]
    assert saved == dataclasses.replace(cp, window_id=saved.window_id, created_at=saved.created_at)
    assert latest_checkpoint(conn, "sess").record().compaction_item is None
    journal.close()
    record_forwarded(conn, "sess", cp2.id, 5, 1234)
    mark_force_compact(conn, "sess")
    st = session_state(conn, "sess")
    assert st.force_compact and st.last.client_items == 5 and st.last.sent_bytes == 1234
    record_forwarded(conn, "sess", cp2.id, 6, 1300)
    assert not session_state(conn, "sess").force_compact
    record_event(conn, "sess", "compaction", "remote", "threshold", cp.id)
    assert [(e.kind, e.outcome) for e in events(conn, "sess")] == [("compaction", "remote")]
    conn.close()
