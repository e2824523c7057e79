"""The sidecar `openai_web_search` (seed 004 §4.2, §5.1, issue 15) over REST and MCP against the emulator's
hosted search: the request field by field against the OpenAPI description, the API-key (JSON) and ChatGPT
(SSE, terminal output empty) routes, sources, failures without retry; and `web_search.backend`: the folded
switch, `auto` decided before the request, the native fixes and what status says."""

from __future__ import annotations

import functools

import aiohttp
import orjson
import pytest

from proxy.app.status import capability_status
from proxy.config import Config, ConfigError, WebSearchConfig, load_config, set_key, with_overrides
from proxy.transforms.web_search import (
    SOURCES_INCLUDE,
    WebSearchSettings,
    decide_native,
    inject_web_search,
    native_status,
    search_path,
    sidecar_status,
)
from tests.emulator import Emulator
from tests.emulator.replies import Text, server_error_500
from tests.emulator.search import hosted_search
from tests.openapi_schema import schema_errors, spec_available, validate

API_KEY = "sk-test-sidecar-0123456789abcdef"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzaWRlY2FyIn0.c2lnbmF0dXJlLXNpZGVjYXI"
TASK = "task_search"
QUERY = "what is new in asyncio, secret-query-91c2"
# The capability turned on explicitly, whatever the default.
ON = functools.partial(WebSearchConfig, enabled=True)
SIDECAR = {"web_search.enabled": True, "web_search.sidecar_model": "gpt-5.4-mini", "web_search.backend": "sidecar"}


async def hand_over(srv, base_url: str, headers: dict[str, str]) -> None:
    body = {"task": TASK, "upstream": {"base_url": base_url, "route_kind": "codex" if "codex" in base_url else "api",
                                       "official": False, "credentials_allowed": True, "headers": headers}}
    async with aiohttp.ClientSession() as http, http.put(f"{srv.url}/v1/credentials", data=orjson.dumps(body),
                                                         headers=srv.headers()) as resp:
        assert resp.status == 204


def search_requests(emu: Emulator):
    return [r for r in emu.requests if r.route == "responses"]


@pytest.fixture
async def srv(tool_server, emulator: Emulator):
    emulator.set_default(hosted_search())
    return await tool_server({**SIDECAR, "web_search.sidecar_effort": "low", "web_search.mode": "cached",
                              "web_search.context_size": "high"})


async def test_api_route_request_shape_and_result(srv, emulator):
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert res.ok, res.body
    [req] = search_requests(emulator)
    body = req.json
    assert req.path == "/v1/responses"
    # field by field: exactly these, with these values
    assert body == {
        "model": "gpt-5.4-mini",
        "instructions": body["instructions"],
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUERY}]}],
        "tools": [{"type": "web_search", "external_web_access": False, "search_context_size": "high"}],
        "tool_choice": "required",
        "store": False,
        "include": [SOURCES_INCLUDE],
        "stream": False,
        "reasoning": {"effort": "low"},
    }
    assert isinstance(body["instructions"], str) and QUERY not in body["instructions"]
    if spec_available():
        validate("CreateResponse", body)
        for name, value in body.items():  # each field on its own against the schema's property
            assert not schema_errors("CreateResponse", {"model": body["model"], name: value}), name
    assert "Here is what the web says" in res.text
    urls = [s["url"] for s in res.details["sources"]]
    assert urls == ["https://docs.python.org/3/library/asyncio.html", "https://www.python.org/"]  # de-duplicated
    assert res.details["sources"][0]["title"]
    assert "https://www.python.org/" in res.text and res.details["searches"] == 1
    assert res.details["usage"]["input_tokens"] > 0 and res.details["backend"] == "api"


async def test_chatgpt_route_streams_and_collects_output_items(srv, emulator):
    """The codex-backend format through a gateway that speaks it with its own (API) key. A ChatGPT sign-in
    is never handed over for a gateway (issue 31): the tool server refuses it."""
    body = {"task": TASK, "upstream": {"base_url": emulator.url + "/backend-api/codex", "route_kind": "codex",
                                       "official": False, "credentials_allowed": True,
                                       "headers": {"authorization": f"Bearer {JWT}", "chatgpt-account-id": "a"}}}
    async with aiohttp.ClientSession() as http, http.put(f"{srv.url}/v1/credentials", data=orjson.dumps(body),
                                                         headers=srv.headers()) as resp:
        assert resp.status == 400
    await hand_over(srv, emulator.url + "/backend-api/codex", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.mcp("openai_web_search", {"query": QUERY}, task=TASK)
    assert not res.is_error, res.text
    [req] = search_requests(emulator)
    assert req.path == "/backend-api/codex/responses" and req.json["stream"] is True
    headers = {k.lower(): v for k, v in req.headers}
    assert headers["authorization"] == f"Bearer {API_KEY}" and headers["accept"] == "text/event-stream"
    assert "chatgpt-account-id" not in headers
    # the terminal event's output was empty: sources came from output_item.done
    assert [s["url"] for s in res.structured["sources"]] == ["https://docs.python.org/3/library/asyncio.html",
                                                             "https://www.python.org/"]
    assert res.structured["backend"] == "codex" and "usage" in res.structured


async def test_at_most_twenty_sources(srv, emulator):
    many = [f"https://example.org/page/{n}" for n in range(30)] + ["https://example.org/page/3#frag"]
    emulator.set_default(hosted_search(sources=many))
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert res.ok
    urls = [s["url"] for s in res.details["sources"]]
    assert urls == [f"https://example.org/page/{n}" for n in range(20)]


async def test_no_web_search_call_is_a_failure(srv, emulator):
    emulator.set_default(Text("I did not search."))
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert not res.body["ok"] and res.details["error"] == "search_failed" and "web_search_call" in res.text


async def test_upstream_error_is_returned_once_without_retry_or_fallback(srv, emulator):
    emulator.script(server_error_500())
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert not res.body["ok"] and res.details["error"] == "upstream_error" and "not retried" in res.text
    assert len(search_requests(emulator)) == 1


async def test_no_executor_or_no_credentials_are_clear_errors(tool_server, emulator, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    srv = await tool_server(SIDECAR)
    res = await srv.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert res.details["error"] == "no_credentials" and "OPENAI_API_KEY" in res.text
    # no executor: unavailable, says what to set
    bare = await tool_server({"web_search.enabled": True, "web_search.backend": "sidecar"})
    assert "openai_web_search" not in [t["name"] for t in await bare.list_rest()]
    res = await bare.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert res.status == 503 and res.body["error"]["code"] == "unavailable"
    assert "web_search.sidecar_model" in res.body["error"]["message"]
    assert "openai_web_search" not in [t["name"] for t in await (await tool_server({})).list_rest()]  # off by default
    assert search_requests(emulator) == []


async def test_only_the_query_is_accepted(srv, emulator):
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    for args in ({"query": QUERY, "model": "gpt-5"}, {}, {"query": ""}):
        assert (await srv.rest("openai_web_search", args, task=TASK)).status == 400
    assert search_requests(emulator) == []


# ---- web_search.backend --------------------------------------------------------------------------------


def test_old_sidecar_switch_folds_into_the_backend(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"sidecar_search": {"enabled": true}, "web_search": {"sidecar_model": "m"}}')
    cfg = load_config(path)
    assert cfg.web_search.backend == "sidecar" and cfg.enabled("sidecar_search")
    with pytest.raises(ConfigError):
        set_key(Config(), "sidecar_search.enabled", '"yes"')
    assert set_key(Config(), "sidecar_search.enabled", "true").web_search.backend == "sidecar"
    on = with_overrides(set_key(Config(), "web_search.sidecar_model", "m"), ["sidecar_search"], [])
    assert on.web_search.backend == "sidecar"
    assert with_overrides(on, [], ["sidecar_search"]).web_search.backend == "off"
    assert not Config().enabled("sidecar_search")  # off by default


@pytest.mark.parametrize(("backend", "model", "eligible", "path"), [
    ("auto", None, True, "native"), ("auto", None, False, "off"), ("auto", "m", False, "sidecar"),
    ("auto", "m", True, "native"), ("native", "m", False, "off"), ("sidecar", "m", True, "sidecar"),
    ("sidecar", None, True, "sidecar"), ("off", "m", True, "off"),
])
def test_search_path_is_decided_before_the_request(backend, model, eligible, path):
    assert search_path(ON(backend=backend, sidecar_model=model), eligible) == path


def test_tool_choice_none_is_left_alone():
    payload = {"model": "gpt-5", "input": "hi", "tool_choice": "none", "tools": []}
    d = decide_native(ON(), True, None, payload)
    assert (d.apply, d.reason) == (False, "tool_choice_none")
    assert decide_native(ON(), True, None, {**payload, "tool_choice": "auto"}).apply


@pytest.mark.parametrize("name", ["openai_web_search", "mcp__ctproxy__openai_web_search"])
def test_a_request_offering_the_sidecar_gets_no_native_search_in_auto(name):
    payload = {"model": "gpt-5", "input": "hi", "tools": [{"type": "function", "name": name, "parameters": {}}]}
    d = decide_native(ON(sidecar_model="m"), True, None, payload)
    assert (d.apply, d.reason) == (False, "sidecar")
    assert decide_native(ON(backend="native"), True, None, payload).apply  # forced native stays
    assert inject_web_search(payload, WebSearchSettings()) is not payload  # the transform itself still would


def test_status_says_what_really_happens():
    state, why = native_status(ON(), False, True)
    assert state == "active" and "trusted non-official upstream" in why and "official routes" not in why
    assert "official routes" in native_status(ON(), True, False)[1]
    assert native_status(ON(), False, False)[0] == "unavailable"
    assert native_status(ON(sidecar_model="m"), False, False)[0] == "active"
    assert sidecar_status(ON(backend="sidecar"), True, False)[0] == "unavailable"
    state, why = sidecar_status(ON(backend="sidecar", sidecar_model="gpt-5.4-mini",
                                                sidecar_effort="low"), True, False)
    assert state == "active" and "gpt-5.4-mini" in why and "effort low" in why and "billed" in why
    assert "API key" in why and "ChatGPT sign-in" in why
    assert "OPENAI_API_KEY only" in sidecar_status(ON(sidecar_model="m"), False, False)[1]
    img = capability_status(set_key(Config(), "image_generation.enabled", "true"), "image_generation")
    assert img.state == "active" and "images/generations" in img.reason
    for st in (capability_status(Config(), "sidecar_search"), capability_status(Config(), "web_search")):
        assert st.state != "deferred"


async def test_debug_output_holds_no_query_answer_or_credential(srv, emulator, caplog):
    import logging

    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    with caplog.at_level(logging.DEBUG):
        res = await srv.rest("openai_web_search", {"query": QUERY}, task=TASK)
    assert res.ok
    assert "openai_web_search upstream outcome=answered" in caplog.text
    for secret in (QUERY, "secret-query", API_KEY, "Bearer", "python.org", "Here is what the web says"):
        assert secret not in caplog.text


async def test_bridge_endpoint_call_searches_with_the_agent_requests_credentials(srv, emulator):
    call = {"name": "openai_web_search", "kind": "function", "arguments": orjson.dumps({"query": QUERY}).decode(),
            "task": "task_other", "upstream": {"base_url": emulator.url + "/v1", "route_kind": "api",
                                               "official": False, "credentials_allowed": True,
                                               "headers": {"authorization": f"Bearer {API_KEY}"}}}
    async with aiohttp.ClientSession() as http, http.post(f"{srv.url}/v1/bridge/call", data=orjson.dumps(call),
                                                          headers=srv.headers()) as resp:
        out = await resp.json()
    assert resp.status == 200 and not out["is_error"], out
    assert "https://www.python.org/" in out["output"]
    [req] = search_requests(emulator)
    assert dict((k.lower(), v) for k, v in req.headers)["authorization"] == f"Bearer {API_KEY}"
    assert req.json["tool_choice"] == "required" and req.json["input"][0]["content"][0]["text"] == QUERY
