"""Kind matches host (seed 004 §6, issue 15): an API key only to api.openai.com/v1, ChatGPT OAuth only to
chatgpt.com/backend-api/codex; a mismatch never leaves the proxy; a trusted upstream gets API keys only
(issue 31); an untrusted one never receives a credential."""

from __future__ import annotations

import orjson
import pytest
from mitmproxy import http
from mitmproxy.proxy.mode_specs import ProxyMode
from mitmproxy.test import taddons, tflow, tutils

from addons.guard import Guard
from proxy import routes
from proxy.app import runtime
from proxy.host.flowstate import state_of
from proxy.routes import Route, credential_kind, credential_mismatch, may_receive_credentials

JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ1c2VyIn0.c2lnbmF0dXJl"
API_KEY = "sk-proj-abcdefABCDEF0123456789"
OAUTH = [("Authorization", f"Bearer {JWT}"), ("chatgpt-account-id", "acct-1")]
KEY = [("Authorization", f"Bearer {API_KEY}")]
API = ("https", "api.openai.com", 443, "/v1/responses")
CODEX = ("https", "chatgpt.com", 443, "/backend-api/codex/responses")
OFFICIAL = Route(kind="api", official=True, trusted=False)


@pytest.mark.parametrize(("headers", "kind"), [
    (KEY, "api_key"),
    ([("Authorization", "Bearer not-a-jwt-but-a-gateway-key")], "api_key"),
    ([("api-key", "k")], "api_key"),
    ([("x-api-key", "k")], "api_key"),
    (OAUTH, "chatgpt"),
    ([("Authorization", f"Bearer {JWT}")], "chatgpt"),
    ([("chatgpt-account-id", "acct-1")], "chatgpt"),
    ([*KEY, ("chatgpt-account-id", "acct-1")], "mixed"),
    ([("content-type", "application/json")], None),
    ({"AUTHORIZATION": f"bearer {JWT}"}, "chatgpt"),
])
def test_credential_kind(headers, kind):
    assert credential_kind(headers) == kind


@pytest.mark.parametrize(("dest", "headers", "allowed"), [
    (API, KEY, True),
    (CODEX, OAUTH, True),
    (API, OAUTH, False),  # a ChatGPT token never goes to api.openai.com
    (CODEX, KEY, False),  # an API key never goes to chatgpt.com
    (API, [*KEY, ("chatgpt-account-id", "a")], False),
    (CODEX, [*KEY, ("chatgpt-account-id", "a")], False),
    (API, [], True),  # nothing to refuse
    (("https", "api.openai.com", 443, "/backend-api/codex/responses"), KEY, False),  # look-alike route
    (("http", "api.openai.com", 80, "/v1/responses"), KEY, False),
    (("https", "chatgpt.com.evil.example", 443, "/backend-api/codex/responses"), OAUTH, False),
])
def test_kind_matches_host(dest, headers, allowed):
    assert may_receive_credentials(*dest, OFFICIAL, True, headers) is allowed


def test_without_credentials_only_the_destination_is_judged():
    assert may_receive_credentials(*CODEX, OFFICIAL, True, {})
    assert not may_receive_credentials("http", "chatgpt.com", 80, "/backend-api/codex/x", OFFICIAL, True, {})


def test_the_rule_has_no_destination_only_form():
    with pytest.raises(TypeError):
        may_receive_credentials(*CODEX, OFFICIAL, True)  # type: ignore[call-arg]


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_a_trusted_gateway_gets_api_keys_only_and_untrusted_gets_nothing(scheme):
    """Issue 31 / defect 4: `--trust-upstream` forwards API keys only; a ChatGPT sign-in (its JWT, its
    account header, or either mixed with a key) never goes to a gateway, over http or https."""
    trusted = Route(kind="codex", official=False, trusted=True)
    untrusted = Route(kind="codex", official=False, trusted=False)
    dest = (scheme, "127.0.0.1", 9999, "/backend-api/codex/responses")
    assert may_receive_credentials(*dest, trusted, True, KEY)
    assert may_receive_credentials(*dest, trusted, True, {})
    for sign_in in (OAUTH, OAUTH[:1], OAUTH[1:], [*KEY, OAUTH[1]]):
        assert not may_receive_credentials(*dest, trusted, True, sign_in)
    for headers in (KEY, OAUTH, {}):
        assert not may_receive_credentials(*dest, untrusted, True, headers)
        assert not may_receive_credentials(*dest, trusted, False, headers)  # trust is for reverse mode only


def test_mismatch_message_names_kinds_and_routes_never_values():
    why = credential_mismatch(*CODEX, KEY)
    assert why is not None and "API key" in why and "api.openai.com/v1" in why
    assert API_KEY not in why
    why = credential_mismatch(*API, OAUTH)
    assert why is not None and "ChatGPT" in why and "chatgpt.com/backend-api/codex" in why and JWT not in why
    assert credential_mismatch(*API, KEY) is None
    assert credential_mismatch("https", "example.com", 443, "/v1/x", KEY) is None  # not official: not a mismatch


# ---- the guard on flows ------------------------------------------------------------------------------


@pytest.fixture
def guard_rt(tmp_path):
    def make(trusted: bool = False, upstream: str | None = None):
        built = runtime.build(state_dir=str(tmp_path / "state"), upstream=upstream, trust_upstream=trusted)
        runtime.install(built)
        return built

    yield make
    runtime.uninstall()


def flow_to(scheme, host, port, path, headers, reverse=False):
    req = tutils.treq(method=b"POST", scheme=scheme.encode(), host=host, port=port, path=path.encode(),
                      content=b'{"model":"gpt-5","input":"hi"}',
                      headers=((b"content-type", b"application/json"),
                               *((k.encode(), v.encode()) for k, v in headers)))
    flow = tflow.tflow(req=req)
    if reverse:
        flow.client_conn.proxy_mode = ProxyMode.parse(f"reverse:{scheme}://{host}:{port}")
    return flow


def run_guard(flow):
    guard = Guard()
    with taddons.context(guard):
        guard.request(flow)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(("dest", "headers"), [(CODEX, KEY), (API, OAUTH)])
def test_guard_refuses_the_wrong_kind_locally(guard_rt, dest, headers, reverse):
    guard_rt()
    flow = flow_to(*dest, headers, reverse=reverse)
    run_guard(flow)
    assert flow.response is not None and flow.response.status_code == 403
    err = orjson.loads(flow.response.content)["error"]
    assert err["code"] == "credential_kind_mismatch" and err["type"] == "invalid_request_error"
    assert API_KEY.encode() not in flow.response.content and JWT.encode() not in flow.response.content
    assert flow.response.headers["x-ctproxy-error"] == "credential_kind_mismatch"


@pytest.mark.parametrize(("dest", "headers"), [(API, KEY), (CODEX, OAUTH)])
def test_guard_forwards_the_right_kind(guard_rt, dest, headers):
    guard_rt()
    flow = flow_to(*dest, headers, reverse=True)
    run_guard(flow)
    assert flow.response is None
    assert flow.request.headers["authorization"] == headers[0][1]


def test_guard_strips_for_an_untrusted_upstream_of_either_kind(guard_rt):
    guard_rt(trusted=False, upstream="http://127.0.0.1:9999")
    for headers in (KEY, OAUTH):
        flow = flow_to("http", "127.0.0.1", 9999, "/backend-api/codex/responses", headers, reverse=True)
        state_of(flow).route = Route(kind="codex", official=False, trusted=False)
        run_guard(flow)
        assert flow.response is None
        assert not any(k.lower() in routes.CREDENTIAL_HEADERS for k in flow.request.headers)


def test_guard_forwards_only_an_api_key_to_a_trusted_upstream(guard_rt, monkeypatch):
    monkeypatch.delenv(routes.GATEWAY_KEY_ENV, raising=False)
    guard_rt(trusted=True, upstream="http://127.0.0.1:9999")
    for path, kind in (("/v1/responses", "api"), ("/backend-api/codex/responses", "codex")):
        flow = flow_to("http", "127.0.0.1", 9999, path, KEY, reverse=True)
        state_of(flow).route = Route(kind=kind, official=False, trusted=True)
        run_guard(flow)
        assert flow.response is None and flow.request.headers["authorization"] == KEY[0][1]
        flow = flow_to("http", "127.0.0.1", 9999, path, OAUTH, reverse=True)
        state_of(flow).route = Route(kind=kind, official=False, trusted=True)
        run_guard(flow)
        assert flow.response is None
        assert not any(k.lower() in routes.CREDENTIAL_HEADERS for k in flow.request.headers)


def test_a_gateway_gets_its_own_key_from_the_environment_never_a_sign_in(guard_rt, monkeypatch):
    monkeypatch.setenv(routes.GATEWAY_KEY_ENV, "gw-key-123")
    guard_rt(trusted=True, upstream="http://127.0.0.1:9999")
    for headers, expected in ((OAUTH, "Bearer gw-key-123"), ([], "Bearer gw-key-123"), (KEY, KEY[0][1])):
        flow = flow_to("http", "127.0.0.1", 9999, "/backend-api/codex/responses", headers, reverse=True)
        state_of(flow).route = Route(kind="codex", official=False, trusted=True)
        run_guard(flow)
        assert flow.response is None and flow.request.headers["authorization"] == expected
        assert "chatgpt-account-id" not in flow.request.headers
    # never to an untrusted upstream, and a JWT in the variable is no gateway key
    flow = flow_to("http", "127.0.0.1", 9999, "/v1/responses", OAUTH, reverse=True)
    state_of(flow).route = Route(kind="api", official=False, trusted=False)
    run_guard(flow)
    assert "authorization" not in flow.request.headers
    monkeypatch.setenv(routes.GATEWAY_KEY_ENV, JWT)
    flow = flow_to("http", "127.0.0.1", 9999, "/v1/responses", OAUTH, reverse=True)
    state_of(flow).route = Route(kind="api", official=False, trusted=True)
    run_guard(flow)
    assert "authorization" not in flow.request.headers


@pytest.mark.parametrize(("dest", "headers", "allowed"), [
    (CODEX, KEY, False), (CODEX, OAUTH, True), (API, KEY, True), (API, OAUTH, False)])
def test_compactions_own_call_follows_the_kind_rule(dest, headers, allowed):
    """Compaction runs before the guard and calls the same endpoint itself: the kind is judged there too."""
    from addons._flow import credentials_allowed as _credentials_allowed

    scheme, host, port, path = dest
    req = tutils.treq(method=b"POST", scheme=scheme.encode(), host=host, port=port, path=path.encode(),
                      headers=http.Headers([(k.encode(), v.encode()) for k, v in headers]))
    flow = tflow.tflow(req=req)
    kind = routes.kind_of_path(path)
    assert _credentials_allowed(flow, Route(kind=kind, official=True, trusted=False)) is allowed


@pytest.mark.parametrize(("headers", "allowed"), [(KEY, True), (OAUTH, False), ([OAUTH[1]], False)])
def test_compactions_own_call_to_a_trusted_gateway_carries_no_sign_in(headers, allowed):
    """Issue 31: compaction's call to a trusted gateway carries an API key, never a ChatGPT sign-in."""
    from mitmproxy.proxy.mode_specs import ProxyMode

    from addons._flow import credentials_allowed as _credentials_allowed

    req = tutils.treq(method=b"POST", scheme=b"http", host="127.0.0.1", port=9999, path=b"/backend-api/codex/responses",
                      headers=http.Headers([(k.encode(), v.encode()) for k, v in headers]))
    flow = tflow.tflow(req=req)
    flow.client_conn.proxy_mode = ProxyMode.parse("reverse:http://127.0.0.1:9999")
    assert _credentials_allowed(flow, Route(kind="codex", official=False, trusted=True)) is allowed

