"""Routes, the credential boundary's normalisation, configuration and session identity."""

from __future__ import annotations

import json

import pytest

from proxy.config import CAPABILITIES, Config, ConfigError, get_key, load_config, set_key, with_overrides
from proxy.routes import UpstreamURLError, is_official_destination, kind_of_path, parse_upstream
from proxy.session import resolve_session


@pytest.mark.parametrize(("scheme", "host", "port", "path", "kind"), [
    ("https", "api.openai.com", 443, "/v1/responses", "api"),
    ("https", "API.OpenAI.com", 443, "/v1/responses", "api"),
    ("https", "chatgpt.com", 443, "/backend-api/codex/responses", "codex"),
    ("http", "api.openai.com", 80, "/v1/responses", None),
    ("https", "api.openai.com", 8443, "/v1/responses", None),
    ("https", "api.openai.com.evil.com", 443, "/v1/responses", None),
    ("https", "evil-api.openai.com", 443, "/v1/responses", None),
    ("https", "api.openai.com.", 443, "/v1/responses", None),
    ("https", "аpi.openai.com", 443, "/v1/responses", None),  # Cyrillic а
    ("https", "xn--pi-7ld.openai.com", 443, "/v1/responses", None),
    ("https", "chatgpt.com", 443, "/v1/responses", None),  # API key path on the Codex host
    ("https", "api.openai.com", 443, "/backend-api/codex/responses", None),
    ("https", "api.openai.com", 443, "/v1/../admin", None),
    ("https", "api.openai.com", 443, "/v1/%2e%2e/admin", None),
    ("https", "api.openai.com", 443, "/other", None),
])
def test_official_destination(scheme, host, port, path, kind):
    assert is_official_destination(scheme, host, port, path) == kind


def test_kind_of_path():
    assert kind_of_path("/v1/responses?x=1") == "api"
    assert kind_of_path("/backend-api/codex/responses") == "codex"
    assert kind_of_path("/v2/responses") is None


def test_parse_upstream():
    assert parse_upstream(None).official
    assert parse_upstream("https://api.openai.com/v1").official
    up = parse_upstream("http://127.0.0.1:9999/gw/", trusted=True)
    assert up.origin == "http://127.0.0.1:9999" and up.prefix == "/gw" and up.trusted
    for bad in ("ftp://x", "http://user:pw@host", "http://h/?q=1", "nohost"):
        with pytest.raises(UpstreamURLError):
            parse_upstream(bad)


def test_config_defaults_and_unknown_keys(tmp_path):
    cfg = Config()
    # every capability off on a fresh configuration but web search (on, `auto`: docs/pipeline.md)
    assert cfg.web_search.enabled and cfg.web_search.backend == "auto"
    assert not cfg.remote_compaction.enabled and cfg.remote_compaction.threshold == 0.8
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"web_search": {"backend": "native", "nope": 1}}))
    with pytest.raises(ConfigError, match=r"unknown key 'web_search\.nope'"):
        load_config(path)
    path.write_text(json.dumps({"shell": {"enabled": "maybe"}}))
    with pytest.raises(ConfigError, match=r"shell\.enabled"):
        load_config(path)
    assert load_config(tmp_path / "missing.json") == Config()


def test_dotted_get_set_and_overrides():
    cfg = set_key(Config(), "web_search.backend", "native")
    assert get_key(cfg, "web_search.backend") == "native"
    cfg = set_key(cfg, "shell.enabled", "true")
    assert cfg.shell.enabled is True
    with pytest.raises(ConfigError, match="unknown key"):
        set_key(cfg, "shell.nope", "1")
    with pytest.raises(ConfigError):
        set_key(cfg, "web_search.backend", "bogus")
    cfg = with_overrides(Config(), ["apply_patch"], ["web_search"])
    assert cfg.apply_patch.enabled and not cfg.web_search.enabled
    with pytest.raises(ConfigError, match="unknown capability"):
        with_overrides(Config(), ["nope"], [])


def test_disabling_remote_compaction_turns_off_overflow_recovery_too():
    assert Config().remote_compaction.recover_overflow  # on by default, even with threshold compaction off
    cfg = with_overrides(Config(), [], ["remote_compaction"])
    assert not cfg.remote_compaction.enabled and not cfg.remote_compaction.recover_overflow


def test_disable_all_is_a_plain_pass_through():
    cfg = with_overrides(Config(), [], ["all"])
    for name in CAPABILITIES:
        assert get_key(cfg, f"{name}.enabled") is False, name
    assert not cfg.remote_compaction.recover_overflow


def test_session_identity_signals():
    body = {"model": "gpt-5", "instructions": "be brief", "input": [{"role": "user", "content": "a"}]}
    a = resolve_session({"X-CTP-Task": "t1", "x-ctp-agent": "/root/rev"}, body)
    assert a.source == "header" and a.task == "t1" and a.agent == "/root/rev"
    b = resolve_session({"session_id": "s-1"}, body)
    assert b.source == "codex"
    c = resolve_session({}, {**body, "prompt_cache_key": "pck"})
    assert c.source == "prompt_cache_key"
    d = resolve_session({}, {**body, "previous_response_id": "resp_9"}, {"resp_9": "f:abc"})
    assert d.source == "previous_response" and d.session_key == "f:abc"
    e1 = resolve_session({}, body)
    e2 = resolve_session({}, {**body, "input": [*body["input"], {"role": "assistant", "content": "b"}]})
    assert e1.source == "fingerprint" and e1.session_key == e2.session_key  # later turns, same session


def test_input_spellings_are_one_conversation():
    a = resolve_session({}, {"model": "m", "input": "hi"})
    b = resolve_session({}, {"model": "m", "input": [{"role": "user", "content": "hi"}]})
    c = resolve_session({}, {"model": "m", "input": [{"type": "message", "role": "user",
                                                       "content": [{"type": "input_text", "text": "hi"}]}]})
    assert a.session_key == b.session_key == c.session_key


def test_task_members_without_agent_names_are_separate_sessions():
    one = resolve_session({"x-ctp-task": "t"}, {"model": "m", "input": "first agent's prompt"})
    two = resolve_session({"x-ctp-task": "t"}, {"model": "m", "input": "second agent's prompt"})
    assert one.session_key != two.session_key and one.task == two.task == "t"
