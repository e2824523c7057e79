"""Request bodies are read within limits.max_body_bytes (issue 10, point 2).

A compressed body that inflates past the limit is a decompression bomb: refused with a 413 JSON error,
never inflated beyond the limit. A plain body above it passes through byte for byte, features skipped.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import tracemalloc
import zlib
from pathlib import Path

import aiohttp
import brotli
import orjson
import pytest
import zstandard
from mitmproxy.test import taddons, tflow, tutils

import addons
from proxy.host import flowbody
from proxy.host.flowbody import BodyTooLarge, decode_bounded
from proxy.host.flowstate import state_of

MIB = 1024 * 1024
LIMIT = MIB  # configured in the end-to-end tests

ENCODERS = {
    "gzip": lambda b: gzip.compress(b, compresslevel=1),
    "deflate": lambda b: zlib.compress(b, 1),
    "br": lambda b: brotli.compress(b, quality=1),
    "zstd": lambda b: zstandard.ZstdCompressor(level=1).compress(b),
}


def _payload(text_bytes: int) -> bytes:
    return orjson.dumps({"model": "gpt-5", "input": "a" * text_bytes})


# ---- the bounded decoder ------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", sorted(ENCODERS))
def test_decode_bounded_decodes_up_to_the_limit_and_not_a_byte_more(encoding):
    data = bytes(range(256)) * 400 + b"x" * 200_000
    raw = ENCODERS[encoding](data)
    assert decode_bounded(raw, encoding, len(data)) == data
    with pytest.raises(BodyTooLarge):
        decode_bounded(raw, encoding, len(data) - 1)


def test_decode_bounded_reads_what_mitmproxy_reads():
    data = b'{"model":"gpt-5","input":"hi"}' * 1000
    members = gzip.compress(data[:7000]) + gzip.compress(data[7000:])  # two gzip members
    assert decode_bounded(members, "gzip", len(data)) == data
    assert decode_bounded(zlib.compress(data), "gzip", len(data)) == data  # zlib header under "gzip"
    assert decode_bounded(zlib.compress(data)[2:-4], "deflate", len(data)) == data  # raw deflate
    cobj = zstandard.ZstdCompressor().compressobj()  # a zstd frame without its content size
    assert decode_bounded(cobj.compress(data) + cobj.flush(), "zstd", len(data)) == data
    frames = zstandard.ZstdCompressor().compress(data[:5]) + zstandard.ZstdCompressor().compress(data[5:])
    assert decode_bounded(frames, "zstd", len(data)) == data
    with pytest.raises(ValueError):
        decode_bounded(b"not gzip", "gzip", MIB)
    with pytest.raises(ValueError):
        decode_bounded(data, "gzip, br", MIB)  # a list of encodings: mitmproxy does not decode it either


@pytest.mark.parametrize("encoding", sorted(ENCODERS))
def test_a_bomb_is_never_inflated_past_the_limit(encoding):
    bomb = ENCODERS[encoding](b"\0" * (64 * MIB))
    assert len(bomb) < MIB // 2
    tracemalloc.start()
    try:
        with pytest.raises(BodyTooLarge):
            decode_bounded(bomb, encoding, MIB)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * MIB  # mitmproxy's decoder allocates the whole 64 MiB


# ---- the chain, in process -----------------------------------------------------------------------------

def _flow(raw: bytes, encoding: str | None):
    headers = [(b"content-type", b"application/json")]
    if encoding:
        headers.append((b"content-encoding", encoding.encode()))
    req = tutils.treq(method=b"POST", path=b"/v1/responses", content=b"", headers=headers, host="api.openai.com",
                      port=443, scheme=b"https")
    req.raw_content = raw
    return tflow.tflow(req=req)


async def _run_request_hooks(flow, tmp_path: Path, config: dict) -> None:
    (tmp_path / "config.json").write_text(json.dumps(config))
    chain = addons.chain()
    with taddons.context(*chain, loadcore=False) as tctx:
        tctx.options.update(ctp_state_dir=str(tmp_path))
        try:
            for addon in chain:
                fn = getattr(addon, "request", None)
                if fn is not None and (res := fn(flow)) is not None and hasattr(res, "__await__"):
                    await res
        finally:
            for addon in chain:
                done = getattr(addon, "done", None)
                if done is not None and (res := done()) is not None and hasattr(res, "__await__"):
                    await res
            from proxy.app import runtime

            runtime.uninstall()


async def test_the_chain_answers_a_bomb_with_413_and_counts_it(tmp_path):
    raw = gzip.compress(_payload(8 * MIB))
    flow = _flow(raw, "gzip")
    before = dict(flowbody.LIMIT_COUNTS)
    await _run_request_hooks(flow, tmp_path, {"limits": {"max_body_bytes": LIMIT}})
    assert flow.response is not None and flow.response.status_code == 413
    err = orjson.loads(flow.response.content)["error"]
    assert err["code"] == "request_body_too_large" and err["type"] == "invalid_request_error"
    assert str(LIMIT) in err["message"] and "gzip" in err["message"]
    assert flow.request.raw_content is raw  # nothing was rewritten
    assert state_of(flow).body_limit == "refused"
    assert flowbody.LIMIT_COUNTS["refused"] == before["refused"] + 1


async def test_the_chain_passes_a_large_plain_body_untouched(tmp_path, caplog):
    raw = _payload(2 * MIB)
    flow = _flow(raw, None)
    before = dict(flowbody.LIMIT_COUNTS)
    with caplog.at_level("WARNING", logger="ctproxy.body"):
        await _run_request_hooks(flow, tmp_path, {"limits": {"max_body_bytes": LIMIT}})
    assert flow.response is None
    assert flow.request.raw_content is raw  # not parsed, not re-serialized: web search was not injected
    assert state_of(flow).body_limit == "passthrough"
    assert flowbody.LIMIT_COUNTS["passthrough"] == before["passthrough"] + 1
    lines = [r.getMessage() for r in caplog.records if r.name == "ctproxy.body"]
    assert len(lines) == 1 and "passed through untouched" in lines[0] and "aaaa" not in lines[0]


# ---- end to end through `ctproxy up` -------------------------------------------------------------------

def _state(tmp_path: Path) -> Path:
    state = tmp_path / "s"
    state.mkdir()
    (state / "config.json").write_text(json.dumps({"limits": {"max_body_bytes": LIMIT}}))
    return state


async def _post(proxy, body: bytes, encoding: str | None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-test"}
    if encoding:
        headers["Content-Encoding"] = encoding
    async with (aiohttp.ClientSession() as http, asyncio.timeout(60),
                http.post(proxy.url + "/v1/responses", data=body, headers=headers) as resp):
        return resp.status, dict(resp.headers), await resp.read()


@pytest.mark.parametrize("encoding", ["gzip", "zstd", "br"])
async def test_a_decompression_bomb_gets_a_413_json_error(tmp_path, emulator, proxy_factory, encoding):
    proxy = await proxy_factory(upstream=emulator.url, state_dir=_state(tmp_path))
    bomb = ENCODERS[encoding](_payload(16 * MIB))
    status, headers, body = await _post(proxy, bomb, encoding)
    assert status == 413 and headers["Content-Type"].startswith("application/json")
    assert orjson.loads(body)["error"]["code"] == "request_body_too_large"
    assert emulator.responses_requests == []  # refused, not forwarded
    # A compressed body that stays within the limit is still read and served as before.
    status, _, _ = await _post(proxy, ENCODERS[encoding](_payload(1000)), encoding)
    assert status == 200
    assert emulator.responses_requests[0].json["input"] == "a" * 1000
    assert any(t.get("type") == "web_search" for t in emulator.responses_requests[0].json["tools"])


async def test_a_plain_body_over_the_limit_passes_through_byte_for_byte(tmp_path, emulator, proxy_factory):
    proxy = await proxy_factory(upstream=emulator.url, state_dir=_state(tmp_path))
    small = _payload(1000)
    status, _, _ = await _post(proxy, small, None)
    assert status == 200
    assert any(t.get("type") == "web_search" for t in emulator.responses_requests[0].json["tools"])  # features on
    large = _payload(2 * MIB)
    status, _, _ = await _post(proxy, large, None)
    assert status == 200
    assert emulator.responses_requests[1].body == large  # untouched: no web_search injected
    # One line on stderr (written before the request was forwarded), sizes only.
    lines = [line for line in proxy.log().splitlines() if "limits.max_body_bytes" in line]
    assert len(lines) == 1 and "passed through untouched" in lines[0] and "aaaa" not in lines[0]
