"""`openai_generate_image` (seed 004 §5.3, issue 15) over REST and MCP against the emulator's Images API:
the request, the artifact, each credential source, the failure modes (error, not an image, redirect, abort),
no retry, 20 concurrent calls, and nothing secret in the debug log."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from pathlib import Path

import aiohttp
import orjson
import pytest

from proxy.upstream import MemoryTransport, UpstreamTurns
from tests.emulator import Emulator
from tests.emulator.images import images_of, png_bytes
from tests.openapi_schema import spec_available, validate
from tools_server.app import SERVICE_KEY
from tools_server.registry import CallContext, UpstreamAccess

API_KEY = "sk-test-image-key-0123456789abcdef"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJpbWFnZSJ9.c2lnbmF0dXJlLWltYWdl"
ACCOUNT = "acct-image-1"
PROMPT = "a lighthouse made of marzipan, secret-prompt-7f3a"
TASK = "task_img"


async def hand_over(srv, base_url: str, headers: dict[str, str], *, official: bool = False, task: str = TASK,
                    agent: str | None = None) -> int:
    body = {"task": task, "agent": agent, "upstream": {"base_url": base_url, "route_kind":
            "codex" if "/backend-api/codex" in base_url else "api", "official": official,
            "credentials_allowed": True, "headers": headers}}
    async with aiohttp.ClientSession() as http, http.put(f"{srv.url}/v1/credentials", data=orjson.dumps(body),
                                                         headers=srv.headers()) as resp:
        return resp.status


@pytest.fixture
async def srv(tool_server, emulator: Emulator):
    return await tool_server({"image_generation.enabled": True})


def artifacts(srv) -> list[Path]:
    d = srv.services.state.root / "artifacts"
    return sorted(p for p in d.iterdir() if not p.name.startswith(".")) if d.exists() else []


def image_requests(emu: Emulator):
    return [r for r in emu.requests if r.route == "images"]


async def test_rest_generates_one_png_artifact_with_the_sessions_api_key(srv, emulator, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    assert await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"}) == 204
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT, "size": "1024x1536", "quality": "low"},
                         task=TASK)
    assert res.ok, res.body
    [req] = image_requests(emulator)
    assert req.path == "/v1/images/generations" and req.method == "POST"
    assert req.json == {"model": "gpt-image-2", "prompt": PROMPT, "n": 1, "size": "1024x1536", "quality": "low"}
    if spec_available():
        validate("CreateImageRequest", req.json)
    assert dict((k.lower(), v) for k, v in req.headers)["authorization"] == f"Bearer {API_KEY}"
    assert "input" not in req.json and "messages" not in req.json  # no conversation history
    [path] = artifacts(srv)
    details = res.details
    assert details["path"] == str(path) and Path(details["path"]).is_absolute()
    assert details["mime_type"] == "image/png" and details["credential_source"] == "session"
    assert path.parent == srv.services.state.root / "artifacts" and path.suffix == ".png"
    assert path.read_bytes() == png_bytes() and path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert str(path) in res.text
    [img] = res.body["images"]
    assert img["mime_type"] == "image/png" and base64.b64decode(img["data"]) == path.read_bytes()
    assert oct(path.stat().st_mode & 0o777) == "0o600"


async def test_mcp_returns_image_content_and_the_path(srv, emulator):
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.mcp("openai_generate_image", {"prompt": PROMPT}, task=TASK)
    assert not res.is_error, res.text
    images = [c for c in res.content if getattr(c, "type", "") == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    [path] = artifacts(srv)
    assert base64.b64decode(images[0].data) == path.read_bytes()
    assert str(path) in res.text and res.structured["path"] == str(path)
    assert "data" not in res.structured and "b64_json" not in orjson.dumps(res.structured).decode()


async def test_a_chatgpt_sign_in_is_handed_over_for_chatgpt_com_only(srv, emulator, monkeypatch):
    """Issue 31 / defect 4: a sign-in is accepted for https://chatgpt.com/backend-api/codex only; handed over
    for a gateway (the emulator, trusted or not) it is refused, and the tool has no credentials."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    sign_in = {"authorization": f"Bearer {JWT}", "chatgpt-account-id": ACCOUNT}
    assert await hand_over(srv, emulator.url + "/backend-api/codex", sign_in) == 400
    assert await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {JWT}"}) == 400
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT}, task=TASK)
    assert not res.ok and res.body["details"]["error"] == "no_credentials"
    assert image_requests(emulator) == []
    assert await hand_over(srv, "https://chatgpt.com/backend-api/codex", sign_in, official=True) == 204


async def test_sessions_are_kept_apart_and_the_newest_wins(srv, emulator):
    await hand_over(srv, emulator.url + "/v1", {"authorization": "Bearer sk-old"}, agent="/root/a")
    await hand_over(srv, emulator.url + "/v1", {"authorization": "Bearer sk-new"}, agent="/root/a")
    await hand_over(srv, emulator.url + "/v1", {"authorization": "Bearer sk-other"}, agent="/root/b")
    await srv.rest("openai_generate_image", {"prompt": "x"}, task=TASK, agent="/root/a")
    await srv.rest("openai_generate_image", {"prompt": "x"}, task=TASK, agent="/root/b")
    auths = [dict((k.lower(), v) for k, v in r.headers)["authorization"] for r in image_requests(emulator)]
    assert auths == ["Bearer sk-new", "Bearer sk-other"]


async def test_no_credentials_is_a_clear_error(srv, emulator, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT})
    assert res.status == 200 and not res.body["ok"]
    assert res.details["error"] == "no_credentials"
    assert "OPENAI_API_KEY" in res.text and "x-ctp-task" in res.text
    assert image_requests(emulator) == [] and artifacts(srv) == []


async def test_environment_key_goes_to_the_official_images_endpoint(srv, monkeypatch):
    seen = []

    async def official(request):
        seen.append(request)
        body = {"created": 1, "data": [{"b64_json": base64.b64encode(png_bytes()).decode()}]}
        return 200, [("content-type", "application/json")], [orjson.dumps(body)]

    transport = MemoryTransport(official)
    srv.services.upstream_turns = UpstreamTurns(transport)
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT}, task="task_without_requests")
    assert res.ok, res.body
    [req] = seen
    assert req.url == "https://api.openai.com/v1/images/generations" and req.method == "POST"
    assert dict(req.headers)["authorization"] == f"Bearer {API_KEY}" and req.credentials_allowed
    assert res.details["credential_source"] == "environment"


async def test_bridged_call_uses_the_agent_requests_credentials(srv, emulator, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-should-not-be-used")
    registry = srv.app[SERVICE_KEY].registry
    ctx = CallContext(services=srv.services, transport="bridge", upstream=UpstreamAccess(
        base_url=emulator.url + "/v1", route_kind="api", official=False, credentials_allowed=True,
        headers={"authorization": f"Bearer {API_KEY}"}))
    result = await registry.get("openai_generate_image").call({"prompt": PROMPT}, ctx)
    assert not result.is_error, result.text
    assert result.details["credential_source"] == "bridge" and len(result.images) == 1
    [req] = image_requests(emulator)
    assert dict((k.lower(), v) for k, v in req.headers)["authorization"] == f"Bearer {API_KEY}"


async def test_credentials_not_cleared_for_their_route_are_never_used(srv, emulator, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    registry = srv.app[SERVICE_KEY].registry
    tool = registry.get("openai_generate_image")
    # an untrusted upstream: the proxy stripped them; a ChatGPT token claimed for api.openai.com: wrong kind
    for access in (UpstreamAccess(emulator.url + "/v1", "api", False, False, {"authorization": "Bearer sk-x"}),
                   UpstreamAccess("https://api.openai.com/v1", "api", True, True, {"authorization": f"Bearer {JWT}"})):
        result = await tool.call({"prompt": PROMPT}, CallContext(services=srv.services, upstream=access))
        assert result.is_error and result.details["error"] == "no_credentials"
    assert image_requests(emulator) == []
    # and the hand-over refuses them up front
    assert await hand_over(srv, "https://api.openai.com/v1", {"authorization": f"Bearer {JWT}"}, official=True) == 400
    assert await hand_over(srv, "https://chatgpt.com/backend-api/codex", {"authorization": f"Bearer {API_KEY}"},
                           official=True) == 400
    assert await hand_over(srv, "http://api.openai.com/v1", {"authorization": f"Bearer {API_KEY}"},
                           official=True) == 400


async def test_the_hand_over_is_write_only(srv):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{srv.url}/v1/credentials", headers=srv.headers()) as resp:
            assert resp.status == 405
        async with http.put(f"{srv.url}/v1/credentials", data=b'{"task":"t"}') as resp:
            assert resp.status == 401  # the bearer token is required
        async with http.put(f"{srv.url}/v1/credentials", data=b'{"task":"t","upstream":{"headers":{"authorization":'
                            b'"Bearer sk-leak"}}}', headers=srv.headers()) as resp:
            assert resp.status == 400 and b"sk-leak" not in await resp.read()


@pytest.mark.parametrize(("mode", "code"), [("error", "upstream_error"), ("not_image", "upstream_invalid_image"),
                                            ("redirect", "upstream_redirect")])
async def test_failures_are_errors_with_no_artifact_and_no_retry(srv, emulator, mode, code):
    images_of(emulator).mode = mode
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT}, task=TASK)
    assert not res.body["ok"] and res.details["error"] == code, res.body
    assert "not retried" in res.text or "nothing was saved" in res.text
    assert len(image_requests(emulator)) == 1  # one request, never a second
    assert [r for r in emulator.requests if r.route == "other"] == []  # the redirect was not followed
    assert artifacts(srv) == []


async def test_a_jpeg_answer_is_saved_as_the_promised_png(srv, emulator):
    """Defect 14: the tool says "saved as a new PNG file"; a JPEG answer is converted with Pillow."""
    from PIL import Image

    images_of(emulator).mode = "jpeg"
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT}, task=TASK)
    assert res.ok and res.details["mime_type"] == "image/png" and res.details["converted_from"] == "image/jpeg"
    [path] = artifacts(srv)
    assert path.suffix == ".png" and path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size == (4, 4)
    [img] = res.body["images"]
    assert img["mime_type"] == "image/png" and base64.b64decode(img["data"]) == path.read_bytes()


async def test_a_jpeg_that_cannot_be_decoded_saves_nothing(srv, emulator):
    images_of(emulator).mode = "broken_jpeg"
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    res = await srv.rest("openai_generate_image", {"prompt": PROMPT}, task=TASK)
    assert not res.ok and res.body["details"]["error"] == "upstream_invalid_image"
    assert artifacts(srv) == []


async def test_an_abort_after_dispatch_reports_result_unknown(srv, emulator):
    images_of(emulator).mode = "stall"
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    registry = srv.app[SERVICE_KEY].registry
    ctx = CallContext(services=srv.services, task=TASK)
    call = asyncio.create_task(registry.get("openai_generate_image").call({"prompt": PROMPT}, ctx))
    await emulator.wait_for_requests(1)
    ctx.cancel.set()
    result = await asyncio.wait_for(call, 30)
    assert result.is_error and result.details["error"] == "result_unknown"
    assert "unknown" in result.text and "not retried" in result.text
    assert len(image_requests(emulator)) == 1 and artifacts(srv) == []


async def test_twenty_concurrent_calls_make_twenty_unique_artifacts(srv, emulator):
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    results = await asyncio.gather(*(srv.rest("openai_generate_image", {"prompt": f"{PROMPT} {n}"}, task=TASK)
                                     for n in range(20)))
    assert all(r.ok for r in results), [r.body for r in results if not r.ok]
    paths = {r.details["path"] for r in results}
    assert len(paths) == 20 and sorted(paths) == sorted(str(p) for p in artifacts(srv))
    assert len(image_requests(emulator)) == 20
    assert not [p for p in os.listdir(srv.services.state.root / "artifacts") if p.startswith(".")]  # no temp left


async def test_invalid_arguments_are_refused_before_any_request(srv, emulator):
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    for args in ({"prompt": PROMPT, "path": "/tmp/x.png"}, {"prompt": ""}, {"prompt": PROMPT, "quality": "ultra"},
                 {"prompt": PROMPT, "size": "../../x"}):
        res = await srv.rest("openai_generate_image", args, task=TASK)
        assert res.status == 400, args
    assert image_requests(emulator) == []


async def test_debug_output_holds_no_prompt_image_or_credential(srv, emulator, caplog):
    await hand_over(srv, emulator.url + "/v1", {"authorization": f"Bearer {API_KEY}"})
    with caplog.at_level(logging.DEBUG):
        ok = await srv.rest("openai_generate_image", {"prompt": PROMPT}, task=TASK)
        images_of(emulator).mode = "error"
        await srv.rest("openai_generate_image", {"prompt": PROMPT}, task=TASK)
    assert ok.ok
    text = caplog.text
    b64 = ok.body["images"][0]["data"]
    assert "outcome=answered" in text  # the debug line is there...
    for secret in (PROMPT, "marzipan", API_KEY, b64[:40], "Bearer"):  # ...with none of these
        assert secret not in text


async def test_bridge_endpoint_call_uses_the_agent_requests_route_and_credentials(srv, emulator, monkeypatch):
    """The bridge path as the proxy's bridge calls it (POST /v1/bridge/call with `upstream`). The image
    itself is not in the bridge's output yet (tools_server/bridge.py returns text only; issue 15 asks for an
    `input_image`): this checks the credentials, the request and the artifact."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-should-not-be-used")
    call = {"name": "openai_generate_image", "kind": "function", "arguments": orjson.dumps({"prompt": PROMPT}).decode(),
            "call_id": "call_1", "task": TASK, "upstream": {
                "base_url": emulator.url + "/v1", "route_kind": "api", "official": False,
                "credentials_allowed": True, "headers": {"authorization": f"Bearer {API_KEY}"}}}
    async with aiohttp.ClientSession() as http, http.post(f"{srv.url}/v1/bridge/call", data=orjson.dumps(call),
                                                          headers=srv.headers()) as resp:
        assert resp.status == 200
        out = await resp.json()
    assert not out["is_error"], out
    [path] = artifacts(srv)
    assert str(path) in out["output"]
    [req] = image_requests(emulator)
    headers = {k.lower(): v for k, v in req.headers}
    assert req.path == "/v1/images/generations"
    assert headers["authorization"] == f"Bearer {API_KEY}" and "chatgpt-account-id" not in headers
